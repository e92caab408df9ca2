package queen_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// A handler that hangs, ignoring its context, gives its partition back
// after MaxHold: its context is cancelled, renewals stop, and once the
// lease ends the next claim gets the message again, uncharged (with
// RetryLimit 1 a charged failure would have dead-lettered it). With
// KeyConcurrency the other keys' outcomes are kept.
func TestConsumeMaxHoldHandsBackHungHandler(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		name := "unkeyed"
		if keyed {
			name = "keyed"
		}
		t.Run(name, func(t *testing.T) {
			c := open(t)
			q := configure(t, c, "q", queen.QueueOptions{LeaseTime: 2 * time.Second, RetryLimit: 1, DeadLetter: true})
			push(t, q, queen.Item{Partition: "p", Key: "k0", Data: []byte("m0")}, queen.Item{Partition: "p", Key: "k1", Data: []byte("m1")})
			release := make(chan struct{})
			var cancelled, handled1 atomic.Bool
			hung := make(chan struct{})
			ctx, cancel := context.WithCancel(ctxT(t))
			done := make(chan error, 1)
			o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 2}, MaxHold: time.Second}
			if keyed {
				o.KeyConcurrency = 2
			}
			go func() {
				done <- q.Consume(ctx, o, func(hctx context.Context, m *queen.Message) error {
					if string(m.Data) == "m1" {
						handled1.Store(true)
						return nil
					}
					close(hung) // once: the redelivery goes to Pop
					<-hctx.Done()
					cancelled.Store(true)
					<-release
					return nil
				})
			}()
			defer func() {
				close(release)
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
			<-hung
			var got []*queen.Message
			waitFor(t, 30*time.Second, "m0 redelivered", func() bool {
				got = pop(t, q, queen.PopOptions{Batch: 2})
				return len(got) > 0
			})
			if string(got[0].Data) != "m0" {
				t.Fatalf("redelivered %q first, want m0", got[0].Data)
			}
			if !cancelled.Load() {
				t.Fatal("the hung handler's context was not cancelled")
			}
			if keyed {
				if !handled1.Load() || len(got) != 1 {
					t.Fatalf("keyed: m1 handled %v, redelivered %d messages; want m1 handled and only m0 back", handled1.Load(), len(got))
				}
			}
			if n := len(deadLetters(t, q)); n != 0 {
				t.Fatalf("%d dead letters: the hand-back was charged", n)
			}
		})
	}
}

// With MaxHold negative a hung handler keeps its lease renewed: nobody
// else gets its message.
func TestConsumeMaxHoldNegativeKeepsRenewing(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: time.Second})
	pushN(t, q, "p", "m", 1)
	release := make(chan struct{})
	hung := make(chan struct{})
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(ctx, queen.ConsumeOptions{MaxHold: -1}, func(hctx context.Context, m *queen.Message) error {
			close(hung)
			<-release
			return nil
		})
	}()
	defer func() {
		close(release)
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	<-hung
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
		if got := pop(t, q, queen.PopOptions{}); len(got) > 0 {
			t.Fatalf("popped %q while a handler with MaxHold -1 held it", got[0].Data)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
