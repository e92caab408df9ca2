package queen_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/e03140bc/queen"
)

// badReason holds what PostgreSQL text cannot (NUL, invalid UTF-8) and is
// longer than MaxReasonLen, with its cut landing inside a 2-byte character.
var badReason = "bad \x00 nul \xff utf8: " + strings.Repeat("é", queen.MaxReasonLen)

// badReasonKept is what of badReason's start a stored reason must show.
const badReasonKept = "bad  nul \uFFFD utf8: éé"

// checkReason fails t unless r is badReason (within its context) stored
// sanitized: valid UTF-8, no NUL, cut at a character boundary.
func checkReason(t *testing.T, r string) {
	t.Helper()
	if !utf8.ValidString(r) || strings.Contains(r, "\x00") || len(r) > queen.MaxReasonLen ||
		len(r) < queen.MaxReasonLen-utf8.UTFMax || !strings.Contains(r, badReasonKept) {
		t.Fatalf("stored reason (%d bytes) %.80q… is not the sanitized reason", len(r), r)
	}
}

// Every way a reason reaches the store sanitizes it: a reason PostgreSQL
// rejects would fail the settlement (and every one fused with it), and a
// Consume would redeliver the batch forever. Each path here must settle:
// the earlier message acked, the failing one dead-lettered (RetryLimit 0),
// each handled once.
func TestEveryReasonPathSanitized(t *testing.T) {
	type path struct {
		keyed bool
		// consume, if set, is the Consume handler's verdict for a message
		// the test fails; without it the test settles by hand with settle.
		consume     func(ctx context.Context, m *queen.Message) error
		o           queen.ConsumeOptions
		settle      func(t *testing.T, c *queen.Client, q *queen.Queue, m *queen.Message) error
		wantMessage string // what the stored reason also holds
	}
	bad := errors.New(badReason)
	paths := map[string]path{
		"Consume handler error": {consume: func(context.Context, *queen.Message) error { return bad }},
		"Consume panic": {
			consume:     func(context.Context, *queen.Message) error { panic(badReason) },
			wantMessage: queen.ErrPanic.Error(),
		},
		"Consume HandlerTimeout": {
			consume: func(ctx context.Context, _ *queen.Message) error {
				<-ctx.Done()
				return fmt.Errorf("%w: %s", ctx.Err(), badReason)
			},
			o:           queen.ConsumeOptions{HandlerTimeout: 50 * time.Millisecond},
			wantMessage: "deadline exceeded",
		},
		"per-key Consume handler error": {keyed: true, consume: func(context.Context, *queen.Message) error { return bad }},
		"per-key Consume DeadLetter": {keyed: true, consume: func(ctx context.Context, m *queen.Message) error {
			return m.DeadLetter(ctx, bad)
		}},
		"Consume DeadLetter": {consume: func(ctx context.Context, m *queen.Message) error {
			return m.DeadLetter(ctx, bad)
		}},
		"Fail": {settle: func(t *testing.T, _ *queen.Client, _ *queen.Queue, m *queen.Message) error {
			return m.Fail(ctxT(t), bad)
		}},
		"DeadLetter": {settle: func(t *testing.T, _ *queen.Client, _ *queen.Queue, m *queen.Message) error {
			return m.DeadLetter(ctxT(t), bad)
		}},
		"AckBatch fail": {settle: func(t *testing.T, _ *queen.Client, q *queen.Queue, m *queen.Message) error {
			errs, err := q.AckBatch(ctxT(t), []queen.AckRequest{{Message: m, Status: queen.AckFail, Reason: bad}})
			return errors.Join(err, errors.Join(errs...))
		}},
		"AckBatch dead letter": {settle: func(t *testing.T, _ *queen.Client, q *queen.Queue, m *queen.Message) error {
			errs, err := q.AckBatch(ctxT(t), []queen.AckRequest{{Message: m, Status: queen.AckDeadLetter, Reason: bad}})
			return errors.Join(err, errors.Join(errs...))
		}},
		"Tx.Fail": {settle: func(t *testing.T, c *queen.Client, _ *queen.Queue, m *queen.Message) error {
			return c.Tx(ctxT(t), func(tx *queen.Tx) error { tx.Fail(m, bad); return nil })
		}},
	}
	c := open(t)
	for name, p := range paths {
		t.Run(name, func(t *testing.T) {
			q := configure(t, c, strings.ReplaceAll(name, " ", "-"), queen.QueueOptions{DeadLetter: true, RetryLimit: -1})
			items := []queen.Item{{Data: []byte("m0")}, {Data: []byte("m1")}}
			if p.keyed {
				items[0].Key, items[1].Key = "a", "b"
			}
			push(t, q, items...)
			if p.consume != nil {
				consumeOne(t, q, p.o, p.keyed, p.consume)
			} else {
				msgs := pop(t, q, queen.PopOptions{Batch: 2})
				wantData(t, msgs, "m0", "m1")
				ack(t, msgs[0])
				if err := p.settle(t, c, q, msgs[1]); err != nil {
					t.Fatalf("settling with the reason: %v", err)
				}
			}
			dl := deadLetters(t, q)
			if len(dl) != 1 || string(dl[0].Data) != "m1" {
				t.Fatalf("dead letters %+v, want m1's", dl)
			}
			checkReason(t, dl[0].Reason)
			if !strings.Contains(dl[0].Reason, p.wantMessage) {
				t.Fatalf("stored reason %.80q… does not hold %q", dl[0].Reason, p.wantMessage)
			}
			if left := pop(t, q, queen.PopOptions{Batch: 10}); len(left) != 0 {
				t.Fatalf("%q left to deliver after both messages were settled", datas(left))
			}
		})
	}
}

// consumeOne runs Consume on q's two messages, m0 handled fine and m1 by
// fail, until m1's dead letter is stored, and fails t if that takes a
// redelivery (or never happens: the batch's settlement keeps failing).
func consumeOne(t *testing.T, q *queen.Queue, o queen.ConsumeOptions, keyed bool, fail func(context.Context, *queen.Message) error) {
	t.Helper()
	o.PopOptions = queen.PopOptions{Batch: 2, Wait: 100 * time.Millisecond, LeaseTime: time.Second}
	if keyed {
		o.KeyConcurrency = 2
	}
	var mu sync.Mutex
	handled := map[string]int{}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(ctx, o, func(ctx context.Context, m *queen.Message) error {
			mu.Lock()
			handled[string(m.Data)]++
			mu.Unlock()
			if string(m.Data) == "m1" {
				return fail(ctx, m)
			}
			return nil
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(deadLetters(t, q)) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a redelivery would show here
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Consume: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(handled) != "map[m0:1 m1:1]" {
		t.Fatalf("handled %v with %d dead letters, want each once: the settlement with the reason did not apply",
			handled, len(deadLetters(t, q)))
	}
}
