package queen_test

import (
	"testing"

	"github.com/e03140bc/queen"
)

// A partition the client wrongly takes as written to (its key's hash equal
// to a known one's) is created anyway: the bundle claimed known fails and
// goes again with provisioning. Alone and with another partition.
func TestPushWronglyKnownPartition(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "seen", Data: []byte("0")})
	queen.ClaimKnown(c, "q", "alone")
	queen.ClaimKnown(c, "q", "paired")
	for _, items := range [][]queen.Item{
		{{Partition: "alone", Data: []byte("1")}},
		{{Partition: "seen", Data: []byte("2")}, {Partition: "paired", Data: []byte("3")}},
	} {
		res, err := q.Push(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Status != queen.Queued || r.Offset != 0 && items[i].Partition != "seen" {
				t.Fatalf("%s: %+v; want Queued at offset 0", items[i].Partition, r)
			}
		}
	}
	got := map[string]string{}
	for len(got) < 4 {
		msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 10, AutoAck: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			t.Fatalf("popped %v; want 4 messages", got)
		}
		for _, m := range msgs {
			got[string(m.Data)] = m.Partition
		}
	}
	if got["1"] != "alone" || got["3"] != "paired" {
		t.Fatalf("popped %v", got)
	}
}
