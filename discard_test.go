package queen_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// killAll pushes n messages to partition part and dead-letters each for
// group, with reason "<group>/<part>/<i>".
func killAll(t *testing.T, q *queen.Queue, group, part string, n int) {
	t.Helper()
	ctx := ctxT(t)
	pushN(t, q, part, part, n)
	for i := range n {
		msgs, err := q.Pop(ctx, queen.PopOptions{Group: group, Partition: part, Wait: 5 * time.Second})
		if err != nil || len(msgs) != 1 {
			t.Fatalf("pop %s/%s: %d, %v", group, part, len(msgs), err)
		}
		if err := msgs[0].DeadLetter(ctx, fmt.Errorf("%s/%s/%d", group, part, i)); err != nil {
			t.Fatal(err)
		}
	}
}

func deadIDs(t *testing.T, q *queen.Queue) []int64 {
	t.Helper()
	var ids []int64
	for _, d := range deadLetters(t, q) {
		ids = append(ids, d.ID)
	}
	return ids
}

// DiscardDeadLetters deletes exactly what the query selects (IDs, MaxID,
// Groups, Partition, the page) and says how many.
func TestDiscardDeadLettersSelection(t *testing.T) {
	ctx := ctxT(t)
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	other := configure(t, c, "other", queen.QueueOptions{DeadLetter: true})
	killAll(t, q, "", "a", 4)
	killAll(t, q, "g", "b", 3)
	killAll(t, other, "", "a", 2)
	all := deadLetters(t, q)
	if len(all) != 7 {
		t.Fatalf("%d dead letters, want 7", len(all))
	}
	id := func(i int) int64 { return all[i].ID }
	discard := func(name string, o queen.DeadLetterQuery, want int, left ...int64) {
		t.Helper()
		n, err := q.DiscardDeadLetters(ctx, o)
		if err != nil || n != want {
			t.Fatalf("%s: discarded %d, %v; want %d", name, n, err, want)
		}
		if got := deadIDs(t, q); !slices.Equal(got, left) {
			t.Fatalf("%s: left %v, want %v", name, got, left)
		}
	}
	discard("empty IDs", queen.DeadLetterQuery{IDs: []int64{}}, 0, id(0), id(1), id(2), id(3), id(4), id(5), id(6))
	discard("no match", queen.DeadLetterQuery{Partition: "nope"}, 0, id(0), id(1), id(2), id(3), id(4), id(5), id(6))
	discard("IDs", queen.DeadLetterQuery{IDs: []int64{id(1), id(5)}}, 2, id(0), id(2), id(3), id(4), id(6))
	discard("IDs with a group", queen.DeadLetterQuery{IDs: []int64{id(0), id(4)}, Groups: []string{"g"}}, 1,
		id(0), id(2), id(3), id(6))
	discard("MaxID", queen.DeadLetterQuery{MaxID: id(2)}, 2, id(3), id(6))
	discard("group g", queen.DeadLetterQuery{Groups: []string{"g"}}, 1, id(3))
	// The page: at most Limit, from After on, as RequeueDeadLetters.
	killAll(t, q, "", "c", 3)
	rest := deadIDs(t, q)
	discard("page", queen.DeadLetterQuery{After: rest[0], Limit: 2}, 2, rest[0], rest[3])
	discard("the rest", queen.DeadLetterQuery{}, 2)
	discard("none left", queen.DeadLetterQuery{}, 0)
	if n := len(deadLetters(t, other)); n != 2 {
		t.Fatalf("the other queue has %d dead letters, want its 2", n)
	}
	if n, err := c.Queue("missing").DiscardDeadLetters(ctx, queen.DeadLetterQuery{}); err != nil || n != 0 {
		t.Fatalf("a missing queue: %d, %v", n, err)
	}
	if _, err := q.DiscardDeadLetters(ctx, queen.DeadLetterQuery{MaxID: -1}); err == nil {
		t.Fatal("a negative MaxID was accepted")
	}
}

// A discard loop bounded by MaxID ends and leaves the dead letters that
// arrive meanwhile (above MaxID) alone.
func TestDiscardDeadLettersMaxIDWhileDeadLettering(t *testing.T) {
	ctx := ctxT(t)
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	killAll(t, q, "", "a", 5)
	qs := mustQueues(t, c)
	bound := qs[0].LastDeadLetterID
	if bound == 0 || qs[0].DeadLetters != 5 {
		t.Fatalf("Queues = %+v", qs)
	}
	var wg sync.WaitGroup
	wg.Go(func() { killAll(t, q, "", "b", 20) })
	total := 0
	for {
		n, err := q.DiscardDeadLetters(ctx, queen.DeadLetterQuery{MaxID: bound, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	wg.Wait()
	if total != 5 {
		t.Fatalf("discarded %d, want the 5 up to MaxID", total)
	}
	left := deadLetters(t, q)
	if len(left) != 20 {
		t.Fatalf("%d dead letters left, want the 20 dead-lettered meanwhile", len(left))
	}
	for _, d := range left {
		if d.ID <= bound || d.Partition != "b" {
			t.Fatalf("left %+v, at or under MaxID %d", d, bound)
		}
	}
}

// A cancelled context or a closed client deletes nothing.
func TestDiscardDeadLettersCancelledAndClosed(t *testing.T) {
	ctx := ctxT(t)
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	killAll(t, q, "", "a", 3)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if n, err := q.DiscardDeadLetters(cancelled, queen.DeadLetterQuery{}); err == nil || n != 0 {
		t.Fatalf("cancelled: %d, %v; want 0 and an error", n, err)
	}
	if n := len(deadLetters(t, q)); n != 3 {
		t.Fatalf("%d dead letters after a cancelled discard, want 3", n)
	}
	c2 := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
	q2 := c2.Queue("q")
	c2.Close(ctx)
	if n, err := q2.DiscardDeadLetters(ctx, queen.DeadLetterQuery{}); !errors.Is(err, queen.ErrClosed) || n != 0 {
		t.Fatalf("closed client: %d, %v; want ErrClosed", n, err)
	}
	if n := len(deadLetters(t, q)); n != 3 {
		t.Fatalf("%d dead letters after a closed client's discard, want 3", n)
	}
}

// QueueOptions.DeadLetterRetention: a maintenance pass deletes the queue's
// dead letters older than it, and only those; 0 keeps them forever.
func TestDeadLetterRetention(t *testing.T) {
	ctx := ctxT(t)
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true, DeadLetterRetention: time.Hour})
	keep := configure(t, c, "keep", queen.QueueOptions{DeadLetter: true})
	killAll(t, q, "", "a", 5)
	killAll(t, keep, "", "a", 2)
	if qs := mustQueues(t, c); qs[1].Name != "q" || qs[1].Options.DeadLetterRetention != time.Hour ||
		qs[0].Options.DeadLetterRetention != 0 {
		t.Fatalf("Queues options: %+v", qs)
	}
	all := deadLetters(t, q)
	// Three of q's and every one of keep's were dead-lettered two hours ago.
	age := func(queue string, ids ...int64) {
		t.Helper()
		if _, err := c.Pool().Exec(ctx, "UPDATE "+c.Schema()+".dead_letters d SET created_at = now() - interval '2 hours' "+
			"FROM "+c.Schema()+".queues q WHERE q.id = d.queue_id AND q.name = $1 AND ($2::int8[] IS NULL OR d.id = ANY ($2))",
			queue, ids); err != nil {
			t.Fatal(err)
		}
	}
	age("q", all[0].ID, all[1].ID, all[3].ID)
	age("keep", nil...)
	rep := maintain(t, c)
	if rep.DeadLettersDeleted != 3 {
		t.Fatalf("pass deleted %d dead letters, want 3", rep.DeadLettersDeleted)
	}
	if got := deadIDs(t, q); !slices.Equal(got, []int64{all[2].ID, all[4].ID}) {
		t.Fatalf("left %v, want the recent %d and %d", got, all[2].ID, all[4].ID)
	}
	if n := len(deadLetters(t, keep)); n != 2 {
		t.Fatalf("a queue without DeadLetterRetention kept %d of 2", n)
	}
	if rep := maintain(t, c); rep.DeadLettersDeleted != 0 {
		t.Fatalf("second pass deleted %d", rep.DeadLettersDeleted)
	}
	if err := c.Queue("bad").Configure(ctx, queen.QueueOptions{DeadLetterRetention: -time.Second}); err == nil {
		t.Fatal("a negative DeadLetterRetention was accepted")
	}
}

// A pass deletes at most StepRows expired dead letters; the next pass goes
// on.
func TestDeadLetterRetentionBounded(t *testing.T) {
	ctx := ctxT(t)
	c := open(t, manual, func(cfg *queen.Config) { cfg.Maintenance.StepRows = 2 })
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true, DeadLetterRetention: time.Minute})
	killAll(t, q, "", "a", 5)
	if _, err := c.Pool().Exec(ctx, "UPDATE "+c.Schema()+".dead_letters SET created_at = now() - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{2, 2, 1, 0} {
		if rep := maintain(t, c); rep.DeadLettersDeleted != want {
			t.Fatalf("pass %d deleted %d, want %d", i, rep.DeadLettersDeleted, want)
		}
	}
	if n := len(deadLetters(t, q)); n != 0 {
		t.Fatalf("%d dead letters left", n)
	}
}
