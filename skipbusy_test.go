package queen_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// A skip-policy Fail is a settlement of its own (the first statement of its
// transaction, holding nothing): when a push holds the message's partition
// row, it waits for it and re-enqueues the copy at the tail. Falling back
// to redelivery in place there would deliver the failed message again
// before every later one of the partition (and, with a wait, hold them for
// it).
func TestSkipFailWaitsForBusyPartition(t *testing.T) {
	skipOnLayout(t, "its SQL locks partition rows over several shards (FOR UPDATE), which Citus rejects")
	c := open(t)
	ctx := ctxT(t)
	// No wait: the copy is appended at once, under the partition's lock (a
	// failure with a wait only writes its copy aside).
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5,
		RetryBackoff: noBackoff})
	push(t, q, queen.Item{Partition: "p", Data: []byte("a")}, queen.Item{Partition: "p", Data: []byte("b")})
	msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 1})
	if err != nil || len(msgs) != 1 || msgs[0].Offset != 0 {
		t.Fatalf("Pop: %v, %v", msgs, err)
	}

	// The partition row locked as a push's bundle locks it.
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
		" WHERE name = 'p' FOR NO KEY UPDATE"); err != nil {
		t.Fatal(err)
	}
	failed := make(chan error, 1)
	go func() { failed <- msgs[0].Fail(ctx, errors.New("downstream down")) }()
	waitForBlockedStatement(t, c, "settle")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-failed; err != nil {
		t.Fatalf("Fail: %v", err)
	}

	g, _ := gstat(t, q, "", "p")
	if last := status(t, q).Partitions[0].LastOffset; g.Committed != 0 || last != 2 {
		t.Fatalf("after the Fail: committed %d, last offset %d; want the cursor past the failure (0) and its copy at the tail (2)",
			g.Committed, last)
	}
	next, err := q.Pop(ctx, queen.PopOptions{Batch: 1})
	if err != nil || len(next) != 1 || string(next[0].Data) != "b" {
		t.Fatalf("the message behind the failure: %v, %v", next, err)
	}
}
