package queen_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

func TestDeadLettersQuery(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "a", "a", 3)
	pushN(t, q, "b", "b", 2)
	kill := func(group, part string, n int) {
		for i := 0; i < n; i++ {
			msgs := pop(t, q, queen.PopOptions{Group: group, Partition: part})
			if len(msgs) != 1 {
				t.Fatalf("nothing to dead-letter in %s/%s", group, part)
			}
			if err := msgs[0].DeadLetter(ctxT(t), fmt.Errorf("%s/%s/%d", group, part, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	kill("", "a", 3)
	mid := time.Now()
	time.Sleep(20 * time.Millisecond)
	kill("g", "b", 2)

	all, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(all) != 5 {
		t.Fatalf("all: %d, %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i].ID <= all[i-1].ID {
			t.Fatal("not in ID order")
		}
	}
	check := func(name string, o queen.DeadLetterQuery, want ...string) {
		t.Helper()
		got, err := q.DeadLetters(ctxT(t), o)
		if err != nil {
			t.Fatal(err)
		}
		var reasons []string
		for _, d := range got {
			reasons = append(reasons, d.Reason)
		}
		if fmt.Sprint(reasons) != fmt.Sprint(want) {
			t.Fatalf("%s: got %q, want %q", name, reasons, want)
		}
	}
	check("group g", queen.DeadLetterQuery{Groups: []string{"g"}}, "g/b/0", "g/b/1")
	check("queue mode", queen.DeadLetterQuery{Groups: []string{""}}, "/a/0", "/a/1", "/a/2")
	check("partition b", queen.DeadLetterQuery{Partition: "b"}, "g/b/0", "g/b/1")
	check("since", queen.DeadLetterQuery{Since: mid}, "g/b/0", "g/b/1")
	check("until", queen.DeadLetterQuery{Until: mid}, "/a/0", "/a/1", "/a/2")
	check("page 1", queen.DeadLetterQuery{Limit: 2}, "/a/0", "/a/1")
	check("page 2", queen.DeadLetterQuery{Limit: 2, After: all[1].ID}, "/a/2", "g/b/0")
	check("other queue", queen.DeadLetterQuery{Partition: "nope"})
	if got, err := c.Queue("other").DeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || len(got) != 0 {
		t.Fatalf("other queue: %v, %v", got, err)
	}
	if string(all[0].Data) != "a0" || all[0].MessageID.IsNil() {
		t.Fatalf("snapshot %+v", all[0])
	}
	// The snapshot outlives the queue's segments.
	if _, err := c.Pool().Exec(ctxT(t), "DELETE FROM "+c.Schema()+".segments"); err != nil {
		t.Fatal(err)
	}
	again, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{Limit: 1})
	if err != nil || string(again[0].Data) != "a0" {
		t.Fatalf("after segments are gone: %+v, %v", again, err)
	}
}

// DeadLetterQuery.IDs keeps exactly the dead letters named, with the other
// filters, for listing and for requeueing.
func TestDeadLetterQueryIDs(t *testing.T) {
	ctx := ctxT(t)
	c := open(t)
	q := c.Queue("q")
	if err := q.Configure(ctx, queen.QueueOptions{DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "b", "c"} {
		push(t, q, queen.Item{Partition: p, Data: []byte(p)})
	}
	for range 3 {
		msgs, err := q.Pop(ctx, queen.PopOptions{Wait: 5 * time.Second})
		if err != nil || len(msgs) != 1 {
			t.Fatalf("pop: %d, %v", len(msgs), err)
		}
		if err := msgs[0].DeadLetter(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	all, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(all) != 3 {
		t.Fatalf("dead letters: %d, %v", len(all), err)
	}
	ids := []int64{all[0].ID, all[2].ID}
	got, err := q.DeadLetters(ctx, queen.DeadLetterQuery{IDs: ids})
	if err != nil || len(got) != 2 || got[0].ID != ids[0] || got[1].ID != ids[1] {
		t.Fatalf("IDs %v listed %v, %v", ids, got, err)
	}
	if got, err := q.DeadLetters(ctx, queen.DeadLetterQuery{IDs: ids, Partition: all[2].Partition}); err != nil || len(got) != 1 || got[0].ID != ids[1] {
		t.Fatalf("IDs with a partition listed %v, %v", got, err)
	}
	if got, err := q.DeadLetters(ctx, queen.DeadLetterQuery{IDs: []int64{}}); err != nil || len(got) != 0 {
		t.Fatalf("an empty IDs list listed %v, %v (want none)", got, err)
	}
	n, err := q.RequeueDeadLetters(ctx, queen.DeadLetterQuery{IDs: []int64{all[1].ID}})
	if err != nil || n != 1 {
		t.Fatalf("requeue by id: %d, %v", n, err)
	}
	left, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(left) != 2 || left[0].ID != all[0].ID || left[1].ID != all[2].ID {
		t.Fatalf("left %v, %v", left, err)
	}
}

// DeadLetterQuery.MaxID keeps the dead letters up to that ID, with the
// other filters, for listing and for requeueing: a requeue loop bounded by
// the highest ID seen ends even while new dead letters keep coming. A
// negative MaxID is refused.
func TestDeadLetterQueryMaxID(t *testing.T) {
	ctx := ctxT(t)
	c := open(t)
	q := c.Queue("q")
	if err := q.Configure(ctx, queen.QueueOptions{DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	kill := func(n int) {
		t.Helper()
		for range n {
			msgs, err := q.Pop(ctx, queen.PopOptions{Wait: 5 * time.Second})
			if err != nil || len(msgs) != 1 {
				t.Fatalf("pop: %d, %v", len(msgs), err)
			}
			if err := msgs[0].DeadLetter(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range []string{"a", "b", "c"} {
		push(t, q, queen.Item{Partition: p, Data: []byte(p)})
	}
	kill(3)
	all, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(all) != 3 {
		t.Fatalf("dead letters: %d, %v", len(all), err)
	}
	if qs, err := c.Queues(ctx); err != nil || len(qs) != 1 || qs[0].DeadLetters != 3 || qs[0].LastDeadLetterID != all[2].ID {
		t.Fatalf("Queues = %+v, %v; want 3 dead letters, the last %d", qs, err, all[2].ID)
	}
	got, err := q.DeadLetters(ctx, queen.DeadLetterQuery{MaxID: all[1].ID})
	if err != nil || len(got) != 2 || got[0].ID != all[0].ID || got[1].ID != all[1].ID {
		t.Fatalf("MaxID %d listed %v, %v", all[1].ID, got, err)
	}
	if got, err := q.DeadLetters(ctx, queen.DeadLetterQuery{MaxID: all[1].ID, After: all[0].ID}); err != nil || len(got) != 1 || got[0].ID != all[1].ID {
		t.Fatalf("MaxID with After listed %v, %v", got, err)
	}
	// Requeue in pages of one up to the highest ID there is, while every
	// pass dead-letters what it requeued again.
	bound := all[2].ID
	total := 0
	for pass := 0; ; pass++ {
		if pass > 5 {
			t.Fatalf("requeue up to MaxID %d did not end: %d requeued", bound, total)
		}
		n, err := q.RequeueDeadLetters(ctx, queen.DeadLetterQuery{MaxID: bound, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		total += n
		kill(n)
	}
	if total != 3 {
		t.Fatalf("requeued %d up to MaxID, want 3", total)
	}
	left, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(left) != 3 || left[0].ID <= bound {
		t.Fatalf("left %v, %v; want the 3 new dead letters", left, err)
	}
	for _, name := range []string{"DeadLetters", "RequeueDeadLetters"} {
		var err error
		if name == "DeadLetters" {
			_, err = q.DeadLetters(ctx, queen.DeadLetterQuery{MaxID: -1})
		} else {
			_, err = q.RequeueDeadLetters(ctx, queen.DeadLetterQuery{MaxID: -1})
		}
		if err == nil {
			t.Errorf("%s with MaxID -1: no error", name)
		}
	}
	if left2, _ := q.DeadLetters(ctx, queen.DeadLetterQuery{}); len(left2) != 3 {
		t.Fatalf("a refused requeue changed the dead letters: %d left", len(left2))
	}
}

// A dead letter the client cannot decrypt (sealed with a key it lacks, or
// a client without a key) is listed with Err set and no Data; the rest of
// the page is listed as usual.
func TestDeadLettersUndecryptableEntry(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{8}, 32)
	ctx := ctxT(t)
	before := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = oldKey })
	q := configure(t, before, "q", queen.QueueOptions{Encryption: true, DeadLetter: true})
	killAll(t, q, "", "a", 1)
	// The key was rotated and the old one dropped.
	after := open(t, func(cfg *queen.Config) { cfg.Schema, cfg.EncryptionKey = before.Schema(), newKey })
	aq := after.Queue("q")
	killAll(t, aq, "", "b", 2)

	page, err := aq.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil {
		t.Fatalf("DeadLetters failed the page: %v", err)
	}
	if len(page) != 3 {
		t.Fatalf("%d dead letters, want 3", len(page))
	}
	if d := page[0]; !errors.Is(d.Err, queen.ErrEncryption) || d.Data != nil || d.Partition != "a" || d.MessageID.IsNil() {
		t.Fatalf("the old-key dead letter: %+v; want Err ErrEncryption, no Data, the rest listed", d)
	}
	for i, want := range []string{"b0", "b1"} {
		if d := page[i+1]; d.Err != nil || string(d.Data) != want {
			t.Fatalf("dead letter %d: %+v, %v; want %q", i+1, d, d.Err, want)
		}
	}
	// A client without a key lists every one, none decrypted.
	noKey := open(t, func(cfg *queen.Config) { cfg.Schema = before.Schema() })
	page, err = noKey.Queue("q").DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(page) != 3 {
		t.Fatalf("without a key: %d, %v", len(page), err)
	}
	for _, d := range page {
		if !errors.Is(d.Err, queen.ErrEncryption) || d.Data != nil {
			t.Fatalf("without a key: %+v", d)
		}
	}
	// The client that has the old key reads it.
	if page := deadLetters(t, q); page[0].Err != nil || string(page[0].Data) != "a0" {
		t.Fatalf("with the old key: %+v", page[0])
	}
}
