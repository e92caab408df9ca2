package queen_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen"
)

// Every name a public call takes is checked before anything reaches the
// database: a name PostgreSQL text cannot hold, or a longer one than
// allowed, gets ErrInvalidName, never a raw database error (or, for an
// over-long filter, an empty answer as if nothing matched).
func TestEveryPublicCallRejectsBadNames(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	// A queue with a dead letter, so a filter that slipped through would
	// reach the queries behind it.
	good := configure(t, c, "q", queen.QueueOptions{DeadLetter: true, RetryLimit: -1})
	pushN(t, good, "p", "m", 2)
	if err := pop(t, good, queen.PopOptions{Partition: "p"})[0].DeadLetter(ctx, nil); err != nil {
		t.Fatal(err)
	}
	bads := map[string]string{
		"NUL":           "a\x00b",
		"invalid UTF-8": "a\xffb",
		"oversize":      strings.Repeat("n", max(queen.MaxNameLen, queen.MaxKeyLen)+1),
	}
	dlq := func(name string) queen.DeadLetterQuery { return queen.DeadLetterQuery{Partition: name} }
	calls := map[string]func(name string) error{
		"Configure queue": func(n string) error { return c.Queue(n).Configure(ctx, queen.QueueOptions{}) },
		"Delete queue":    func(n string) error { return c.Queue(n).Delete(ctx) },
		"Push queue":      func(n string) error { _, err := c.Queue(n).Push(ctx, []queen.Item{{}}); return err },
		"Push partition": func(n string) error {
			_, err := good.Push(ctx, []queen.Item{{Partition: n}})
			return err
		},
		"Push key": func(n string) error { _, err := good.Push(ctx, []queen.Item{{Key: n}}); return err },
		"PushTx queue": func(n string) error {
			return pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error { _, err := c.Queue(n).PushTx(ctx, tx, []queen.Item{{}}); return err })
		},
		"PushTx partition": func(n string) error {
			return pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error { _, err := good.PushTx(ctx, tx, []queen.Item{{Partition: n}}); return err })
		},
		"Tx.Push queue": func(n string) error {
			return c.Tx(ctx, func(tx *queen.Tx) error { tx.Push(n, []queen.Item{{}}); return nil })
		},
		"Tx.Push partition": func(n string) error {
			return c.Tx(ctx, func(tx *queen.Tx) error { tx.Push("q", []queen.Item{{Partition: n}}); return nil })
		},
		"Pop queue":      func(n string) error { _, err := c.Queue(n).Pop(ctx, queen.PopOptions{}); return err },
		"Pop group":      func(n string) error { _, err := good.Pop(ctx, queen.PopOptions{Group: n}); return err },
		"Pop partition":  func(n string) error { _, err := good.Pop(ctx, queen.PopOptions{Partition: n}); return err },
		"Consume queue":  func(n string) error { return consumeNames(ctx, c.Queue(n), queen.PopOptions{}) },
		"Consume group":  func(n string) error { return consumeNames(ctx, good, queen.PopOptions{Group: n}) },
		"Consume part":   func(n string) error { return consumeNames(ctx, good, queen.PopOptions{Partition: n}) },
		"Peek queue":     func(n string) error { _, err := c.Queue(n).Peek(ctx, queen.PeekOptions{}); return err },
		"Peek partition": func(n string) error { _, err := good.Peek(ctx, queen.PeekOptions{Partition: n}); return err },
		"Status queue":   func(n string) error { _, err := c.Queue(n).Status(ctx); return err },
		"Pause queue":    func(n string) error { return c.Queue(n).Pause(ctx, "") },
		"Pause group":    func(n string) error { return good.Pause(ctx, n) },
		"Resume queue":   func(n string) error { return c.Queue(n).Resume(ctx, "") },
		"Resume group":   func(n string) error { return good.Resume(ctx, n) },
		"DeadLetters queue": func(n string) error {
			_, err := c.Queue(n).DeadLetters(ctx, queen.DeadLetterQuery{})
			return err
		},
		"DeadLetters partition": func(n string) error { _, err := good.DeadLetters(ctx, dlq(n)); return err },
		"DeadLetters groups": func(n string) error {
			_, err := good.DeadLetters(ctx, queen.DeadLetterQuery{Groups: []string{"", n}})
			return err
		},
		"RequeueDeadLetters queue": func(n string) error {
			_, err := c.Queue(n).RequeueDeadLetters(ctx, queen.DeadLetterQuery{})
			return err
		},
		"RequeueDeadLetters partition": func(n string) error { _, err := good.RequeueDeadLetters(ctx, dlq(n)); return err },
		"RequeueDeadLetters groups": func(n string) error {
			_, err := good.RequeueDeadLetters(ctx, queen.DeadLetterQuery{Groups: []string{n}})
			return err
		},
		"DiscardDeadLetters queue": func(n string) error {
			_, err := c.Queue(n).DiscardDeadLetters(ctx, queen.DeadLetterQuery{})
			return err
		},
		"DiscardDeadLetters partition": func(n string) error { _, err := good.DiscardDeadLetters(ctx, dlq(n)); return err },
		"DiscardDeadLetters groups": func(n string) error {
			_, err := good.DiscardDeadLetters(ctx, queen.DeadLetterQuery{Groups: []string{"", n}})
			return err
		},
	}
	for call, f := range calls {
		for kind, name := range bads {
			err := f(name)
			var pgErr *pgconn.PgError
			if !errors.Is(err, queen.ErrInvalidName) || errors.As(err, &pgErr) {
				t.Errorf("%s, %s name: %v; want ErrInvalidName", call, kind, err)
			}
		}
	}
	// Nothing was written or moved: the dead letter is still there, m1
	// still the next message.
	if dl := deadLetters(t, good); len(dl) != 1 {
		t.Fatalf("%d dead letters after the rejected calls, want 1", len(dl))
	}
	wantData(t, pop(t, good, queen.PopOptions{Batch: 10}), "m1")
}

// consumeNames runs Consume with o, which must fail at once.
func consumeNames(ctx context.Context, q *queen.Queue, o queen.PopOptions) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return q.Consume(ctx, queen.ConsumeOptions{PopOptions: o}, func(context.Context, *queen.Message) error {
		cancel()
		return errors.New("a handler ran")
	})
}
