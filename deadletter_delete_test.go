package queen_test

import (
	"errors"
	"testing"

	"github.com/gofrs/uuid/v5"
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
	skipOnLayout(t, "its SQL locks partition rows over several shards (FOR UPDATE), which Citus rejects")
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

// The same race on pop's path: the dead letters of messages a claim could
// not decode (pop_dead_letter, called directly here with the claim's
// lease) take the queue row before the cursor row.
func TestUndecodableDeadLetterRacingDeleteNoDeadlock(t *testing.T) {
	skipOnLayout(t, "its SQL locks partition rows over several shards (FOR UPDATE), which Citus rejects")
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("a")})
	if msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 1}); err != nil || len(msgs) != 1 {
		t.Fatalf("Pop: %v, %v", msgs, err)
	}
	s := pgx.Identifier{c.Schema()}.Sanitize()
	var pid int64
	var lease uuid.UUID
	if err := c.Pool().QueryRow(ctx, "SELECT partition_id, lease_id FROM "+s+".consumers").Scan(&pid, &lease); err != nil {
		t.Fatal(err)
	}

	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+s+".partitions FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- q.Delete(ctx) }()
	waitForBlockedStatement(t, c, "delete_queue")
	dead := make(chan error, 1)
	go func() {
		var ok bool
		dead <- c.Pool().QueryRow(ctx, "SELECT "+s+".pop_dead_letter($1, '', $2, NULL, ARRAY[0::bigint], ARRAY[$3::uuid], "+
			"ARRAY['t'], ARRAY[0], ARRAY['x'::bytea], ARRAY[now()], ARRAY['undecodable'])", pid, lease, uuid.Must(uuid.NewV7())).Scan(&ok)
	}()
	waitForBlockedStatement(t, c, "pop_dead_letter")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Errorf("Delete: %v", err)
	}
	if err := <-dead; err != nil {
		t.Errorf("pop_dead_letter: %v", err)
	}
}
