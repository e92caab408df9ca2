package queen_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// A DeadLetter racing Queue.Delete: the settlement takes its queue's row
// (which the dead letter's foreign key needs) before its cursor row, the
// lock order, so the two serialize. Taken after, the delete (holding the
// queue row, then cascading to the cursor) and the settlement (holding the
// cursor, then waiting for the queue row) deadlock, and PostgreSQL aborts
// one of them with SQLSTATE 40P01.
func TestDeadLetterRacingDeleteNoDeadlock(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("a")})
	msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 1})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Pop: %v, %v", msgs, err)
	}

	// The partition rows held, so that the delete stops holding the queue row.
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- q.Delete(ctx) }()
	waitForBlockedStatement(t, c, "delete_queue")
	dead := make(chan error, 1)
	go func() { dead <- msgs[0].DeadLetter(ctx, errors.New("poison")) }()
	waitForBlockedStatement(t, c, "settle")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Errorf("Delete: %v", err)
	}
	if err := <-dead; err != nil && !errors.Is(err, queen.ErrUnknownMessage) {
		t.Errorf("DeadLetter: %v, want nil or ErrUnknownMessage", err)
	}
}
