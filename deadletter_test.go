package queen_test

import (
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
