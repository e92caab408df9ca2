package queen_test

import (
	"fmt"
	"maps"
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

// An isolated push names its partition's row by the id a verdict gave the
// client. A wrong one (here another partition's of the same queue, as a
// hash collision or a partition created again elsewhere would leave) writes
// nothing there: the push lands in its own partition through the bundle,
// and the client holds the right id from then on.
func TestPushWrongKnownPartitionID(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "a", Data: []byte("a0")})
	push(t, q, queen.Item{Partition: "b", Data: []byte("b0")})
	a, b := partitionIDs(t, c, "q", "a"), partitionIDs(t, c, "q", "b")
	if id, ok := queen.KnownID(c, "q", "a"); !ok || len(a) != 1 || id != a[0] {
		t.Fatalf("known id of a: %d, %v; want %v", id, ok, a)
	}
	queen.ClaimKnownID(c, "q", "a", b[0])
	for i := 1; i <= 2; i++ {
		res := push(t, q, queen.Item{Partition: "a", Data: fmt.Appendf(nil, "a%d", i)})
		if res[0].Status != queen.Queued || res[0].Offset != int64(i) {
			t.Fatalf("push %d to a: %+v; want Queued at offset %d", i, res[0], i)
		}
		if id, ok := queen.KnownID(c, "q", "a"); !ok || id != a[0] {
			t.Fatalf("after push %d the known id of a is %d, %v; want %d", i, id, ok, a[0])
		}
	}
	got := map[string]string{}
	for len(got) < 4 {
		msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 10, AutoAck: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			got[string(m.Data)] = m.Partition
		}
	}
	if want := map[string]string{"a0": "a", "a1": "a", "a2": "a", "b0": "b"}; !maps.Equal(got, want) {
		t.Fatalf("popped %v; want %v", got, want)
	}
}
