package queenui

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest"
)

// A per-row replay selects exactly its dead letter: once that one is gone
// (replayed by someone else between the page and the POST), the replay
// takes nothing, not another dead letter of the same group and partition
// stored in the same microsecond.
func TestReplayOfOneTakesOnlyThatOne(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := queentest.Open(t)
	q := c.Queue("orders")
	if err := q.Configure(ctx, queen.QueueOptions{DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Push(ctx, []queen.Item{{Partition: "p", Data: []byte("a")}, {Partition: "p", Data: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	msgs, err := q.Pop(ctx, queen.PopOptions{Partition: "p", Batch: 2, Wait: 5 * time.Second})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("pop: %d messages, %v", len(msgs), err)
	}
	for _, m := range msgs {
		if err := m.DeadLetter(ctx, errors.New("bad")); err != nil {
			t.Fatal(err)
		}
	}
	// Both stored in one microsecond, as a fused settle can store them.
	if _, err := c.Pool().Exec(ctx, `UPDATE `+pgx.Identifier{c.Schema(), "dead_letters"}.Sanitize()+
		` SET created_at = date_trunc('second', created_at)`); err != nil {
		t.Fatal(err)
	}
	dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters: %d, %v", len(dls), err)
	}
	first := dls[0]
	for i, want := range []int{1, 0} {
		n, err := q.RequeueDeadLetters(ctx, exactly(&first))
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("replay %d of dead letter %d requeued %d, want %d", i+1, first.ID, n, want)
		}
	}
	left, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(left) != 1 || left[0].ID != dls[1].ID {
		t.Fatalf("left %v, %v; want dead letter %d", left, err, dls[1].ID)
	}
}
