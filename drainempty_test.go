package queen_test

import (
	"fmt"
	"testing"

	"github.com/e03140bc/queen"
)

// TestEmptyPopMeansDrained: groups that meet a queue of thousands of
// one-message partitions one after another, each draining it as an
// operator would, popping until a pop comes back empty. An empty pop
// means the group has nothing left to claim: each group has read every
// message by then, though partitions read by the groups before it (and by
// itself) crowd the ready set that its pops' windows sample (a read
// partition leaves it only once its last write is 2 s old).
func TestEmptyPopMeansDrained(t *testing.T) {
	c := open(t, func(c *queen.Config) { c.Maintenance.Interval = -1 })
	drainEachInTurn(t, c.Queue("turns"), 1000)
}

// drainEachInTurn pushes parts one-message partitions to q, then lets
// three groups drain it in turn until their first empty pop, and fails
// unless each read all of them.
func drainEachInTurn(t *testing.T, q *queen.Queue, parts int) {
	t.Helper()
	items := make([]queen.Item, parts)
	for i := range items {
		items[i] = queen.Item{Partition: fmt.Sprintf("r%d", i), Data: []byte("x")}
	}
	for lo := 0; lo < parts; lo += 500 {
		push(t, q, items[lo:min(lo+500, parts)]...)
	}
	for _, g := range []string{"", "g1", "g2"} {
		read := map[string]bool{}
		pops := 0
		for {
			msgs, err := q.Pop(ctxT(t), queen.PopOptions{Group: g, Batch: 1000, Partitions: 8})
			if err != nil {
				t.Fatal(err)
			}
			pops++
			if len(msgs) == 0 {
				break
			}
			for _, m := range msgs {
				read[m.Partition] = true
				if err := m.Ack(ctxT(t)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if len(read) != parts {
			t.Errorf("group %q: an empty pop (its %dth) after reading %d of %d partitions", g, pops, len(read), parts)
		}
	}
}
