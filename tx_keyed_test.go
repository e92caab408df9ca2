package queen_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// The outbox pattern inside a per-key handler: key a's handler acks its
// message and pushes in one Client.Tx while key b's earlier message is
// still running; b then fails. a's Tx must settle only a's offset, so b's
// failure still applies: b comes back (or, with its budget spent, is
// dead-lettered), never lost. A rolled-back Tx settles nothing, acking a
// again in a Tx is refused as already acked, and Consume's own ack of a
// after the handler returns is harmless.
func TestTxAckInKeyedHandlerSettlesOnlyItsMessage(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    queen.QueueOptions
		dead bool // b's one failure spends its budget
	}{
		{"redelivered", queen.QueueOptions{RetryLimit: 5}, false},
		{"dead-lettered", queen.QueueOptions{RetryLimit: 1, DeadLetter: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := open(t)
			q := configure(t, c, "q", tc.o)
			out := c.Queue("out")
			pushKeyed(t, q, "p", "b", "a")
			aDone := make(chan struct{})
			var aOnce sync.Once
			var mu sync.Mutex
			var seen []string // "key@offset#attempt" in start order
			var errs []string
			errorf := func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, fmt.Sprintf(format, args...))
			}
			ctx, cancel := context.WithCancel(ctxT(t))
			errc := make(chan error, 1)
			go func() {
				errc <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2},
					func(hctx context.Context, m *queen.Message) error {
						mu.Lock()
						seen = append(seen, fmt.Sprintf("%s@%d#%d", m.Key, m.Offset, m.Attempt))
						mu.Unlock()
						switch {
						case m.Key == "b" && m.Attempt == 1:
							// Still running while a's Tx commits; fails after.
							select {
							case <-aDone:
							case <-hctx.Done():
							}
							return errors.New("b fails")
						case m.Key == "a":
							defer aOnce.Do(func() { close(aDone) })
							rollback := errors.New("roll back")
							err := c.Tx(hctx, func(tx *queen.Tx) error {
								tx.Ack(m)
								tx.Push("out", []queen.Item{{Data: []byte("never")}})
								return rollback
							})
							if !errors.Is(err, rollback) {
								errorf("rolled-back Tx = %v", err)
							}
							if g := status(t, q).Partitions[0].Groups[0]; g.Committed != -1 || g.Settled != 0 {
								errorf("after a rolled-back Tx: %+v, want nothing settled", g)
							}
							if err := c.Tx(hctx, func(tx *queen.Tx) error {
								tx.Ack(m)
								tx.Push("out", []queen.Item{{Data: []byte("event")}})
								return nil
							}); err != nil {
								errorf("Tx: %v", err)
							}
							if g := status(t, q).Partitions[0].Groups[0]; g.Committed != -1 || g.Settled != 1 {
								errorf("after a's Tx: %+v, want the cursor before b and a settled above it", g)
							}
							err = c.Tx(hctx, func(tx *queen.Tx) error {
								tx.Ack(m)
								return nil
							})
							if !errors.Is(err, queen.ErrTxAborted) || !errors.Is(err, queen.ErrAlreadyAcked) {
								errorf("second Tx ack = %v, want ErrTxAborted and ErrAlreadyAcked", err)
							}
						}
						return nil
					})
			}()
			defer func() {
				cancel()
				if err := <-errc; err != nil {
					t.Error(err)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(errs) > 0 {
					t.Error(errs)
				}
			}()
			what, done := "b redelivered", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return slices.Contains(seen, "b@0#2")
			}
			if tc.dead {
				what, done = "b dead-lettered", func() bool { return len(deadLetters(t, q)) == 1 }
			}
			waitFor(t, 20*time.Second, what, done)
			waitFor(t, 10*time.Second, "the cursor at the end", func() bool {
				g := status(t, q).Partitions[0].Groups[0]
				return g.Committed == 1 && g.Settled == 0 && !g.Leased
			})
			if tc.dead {
				if dl := deadLetters(t, q); dl[0].Offset != 0 {
					t.Errorf("dead letter %+v, want b@0's", dl[0])
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Contains(seen, "a@1#1") || slices.Contains(seen, "a@1#2") {
				t.Fatalf("handled %v: a once", seen)
			}
			got := pop(t, out, queen.PopOptions{Batch: 10, AutoAck: true})
			if len(got) != 1 || string(got[0].Data) != "event" {
				t.Fatalf("out holds %q, want the one committed push", datas(got))
			}
		})
	}
}

// Tx.Fail of a per-key handler's message is refused, as Message.Fail is
// (the handler's error fails it, so that its key pauses), and rolls back
// the Tx's pushes; the message is still the handler's to settle.
func TestTxFailInKeyedHandlerRefused(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	out := c.Queue("out")
	pushKeyed(t, q, "p", "a", "b")
	var mu sync.Mutex
	var errs []string
	handled := 0
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2},
		func(ctx context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			handled++
			if m.Key != "b" {
				return nil
			}
			err := c.Tx(ctx, func(tx *queen.Tx) error {
				tx.Push("out", []queen.Item{{Data: []byte("never")}})
				tx.Fail(m, errors.New("x"))
				return nil
			})
			if !errors.Is(err, queen.ErrTxAborted) || !errors.Is(err, queen.ErrKeyedSettle) {
				errs = append(errs, fmt.Sprintf("Tx.Fail = %v, want ErrTxAborted and ErrKeyedSettle", err))
			}
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return handled >= 2 })
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	waitFor(t, 10*time.Second, "the cursor at the end", func() bool {
		g := status(t, q).Partitions[0].Groups[0]
		return g.Committed == 1 && g.Settled == 0 && g.Failures == 0 && !g.Leased
	})
	if got := pop(t, out, queen.PopOptions{Batch: 10, AutoAck: true}); len(got) != 0 {
		t.Fatalf("out holds %q, want nothing", datas(got))
	}
}

// Without KeyConcurrency Tx.Ack keeps committing the cursor through its
// message, and Consume's own settlement of a batch whose messages the
// handler acked in Client.Tx finds nothing left to do: no "settle failed"
// warning, no redelivery, every push once.
func TestTxAckInConsumeHandlerThenBatchSettle(t *testing.T) {
	var buf lockedBuffer
	c := open(t, func(cfg *queen.Config) {
		cfg.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	q := c.Queue("q")
	out := c.Queue("out")
	push(t, q, queen.Item{Partition: "p", Data: []byte("0")}, queen.Item{Partition: "p", Data: []byte("1")},
		queen.Item{Partition: "p", Data: []byte("2")})
	var mu sync.Mutex
	handled := 0
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}},
		func(ctx context.Context, m *queen.Message) error {
			err := c.Tx(ctx, func(tx *queen.Tx) error {
				tx.Ack(m)
				tx.Push("out", []queen.Item{{Data: m.Data}})
				return nil
			})
			if err != nil {
				t.Errorf("Tx: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			handled++
			return err
		}, func() bool { mu.Lock(); defer mu.Unlock(); return handled >= 3 })
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the cursor at the end", func() bool {
		g := status(t, q).Partitions[0].Groups[0]
		return g.Committed == 2 && !g.Leased
	})
	for _, l := range buf.lines() {
		t.Errorf("logged %v %q (%v)", l["level"], l["msg"], l["err"])
	}
	got := pop(t, out, queen.PopOptions{Batch: 10, AutoAck: true})
	if !slices.Equal(datas(got), []string{"0", "1", "2"}) {
		t.Fatalf("out holds %q, want each push once", datas(got))
	}
}
