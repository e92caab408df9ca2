package queen_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/citus"
)

// A bundle creating its partitions in one insert: a partition whose derived
// id another one holds is skipped by that insert and created at its second
// probe, with its offsets allocated like the others' (new partitions of a
// queue with no dedup window are created already allocated), and a
// partition listed twice takes consecutive offsets in input order.
func TestFirstTouchBundleTakenID(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{})
	qid := queueID(t, c, "q")
	parts := pgx.Identifier{c.Schema(), "partitions"}.Sanitize()
	if _, err := c.Pool().Exec(ctxT(t), `INSERT INTO `+parts+` (id, queue_id, name) VALUES ($1, $2, 'squatter')`,
		citus.PartitionKey(qid, "b", 0), qid); err != nil {
		t.Fatal(err)
	}
	res := push(t, q, queen.Item{Partition: "a", Data: []byte("a0")}, queen.Item{Partition: "b", Data: []byte("b0")},
		queen.Item{Partition: "b", Data: []byte("b1")}, queen.Item{Partition: "c", Data: []byte("c0")},
		queen.Item{Partition: "a", Data: []byte("a1")})
	for i, want := range []int64{0, 0, 1, 0, 1} {
		if res[i].Status != queen.Queued || res[i].Offset != want {
			t.Fatalf("item %d: %+v, want queued at offset %d", i, res[i], want)
		}
	}
	if ids := partitionIDs(t, c, "q", "b"); len(ids) != 1 || ids[0] != citus.PartitionKey(qid, "b", 1) {
		t.Fatalf("b has ids %v, want its second probe", ids)
	}
	for _, n := range []string{"a", "c"} {
		if ids := partitionIDs(t, c, "q", n); len(ids) != 1 || ids[0] != citus.PartitionKey(qid, n, 0) {
			t.Fatalf("%s has ids %v, want its derived id", n, ids)
		}
	}
	// Later pushes continue each partition's offsets.
	push(t, q, queen.Item{Partition: "a", Data: []byte("a2")}, queen.Item{Partition: "b", Data: []byte("b2")})
	wantData(t, pop(t, q, queen.PopOptions{Partition: "a", Batch: 10, AutoAck: true}), "a0", "a1", "a2")
	wantData(t, pop(t, q, queen.PopOptions{Partition: "b", Batch: 10, AutoAck: true}), "b0", "b1", "b2")
	wantData(t, pop(t, q, queen.PopOptions{Partition: "c", Batch: 10, AutoAck: true}), "c0")
}

// Clients that know none of the partitions push bundles creating the same
// new partitions at once, each in its own order: no deadlock, and every
// partition holds every message once, at consecutive offsets from 0, each
// client's in its push order.
func TestFirstTouchConcurrentCreators(t *testing.T) {
	c := open(t)
	configure(t, c, "q", queen.QueueOptions{})
	const clients, parts, each = 6, 120, 3
	var wg sync.WaitGroup
	for k := range clients {
		ck := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
		wg.Go(func() {
			order := rand.Perm(parts)
			var items []queen.Item
			for _, p := range order {
				for i := range each {
					items = append(items, queen.Item{Partition: fmt.Sprintf("p%d", p), Data: []byte(fmt.Sprintf("%d-%d", k, i))})
				}
			}
			res, err := ck.Queue("q").Push(ctxT(t), items)
			if err != nil {
				t.Error(err)
				return
			}
			for i, r := range res {
				if r.Status != queen.Queued {
					t.Errorf("client %d item %d: %+v", k, i, r)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	q := c.Queue("q")
	for p := range parts {
		msgs := pop(t, q, queen.PopOptions{Partition: fmt.Sprintf("p%d", p), Batch: 100, AutoAck: true})
		if len(msgs) != clients*each {
			t.Fatalf("p%d: %d messages, want %d", p, len(msgs), clients*each)
		}
		next := make(map[int]int)
		for i, m := range msgs {
			if m.Offset != int64(i) {
				t.Fatalf("p%d: offset %d at position %d", p, m.Offset, i)
			}
			var k, j int
			if _, err := fmt.Sscanf(string(m.Data), "%d-%d", &k, &j); err != nil {
				t.Fatal(err)
			}
			if j != next[k] {
				t.Fatalf("p%d: client %d's message %d where %d was due", p, k, j, next[k])
			}
			next[k]++
		}
	}
}
