package queen_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// callBundle runs push_bundle over one-message segments, one per name
// (each "queue/partition"), on partitions that exist (p_known), and returns
// each segment's status and offset.
func callBundle(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, schema string, names []string) ([][2]int64, error) {
	qs := make([]string, len(names))
	ps := make([]string, len(names))
	hs := make([][]byte, len(names))
	bs := make([][]byte, len(names))
	for i, n := range names {
		qs[i], ps[i], _ = strings.Cut(n, "/")
		hs[i] = []byte(fmt.Sprintf("%016d", rand.Int64N(1e15)))
		bs[i] = []byte("blob")
	}
	k := len(names)
	rows, err := db.Query(ctx, `SELECT status, coalesce(base_offset, -1) FROM `+pgx.Identifier{schema}.Sanitize()+`.push_bundle(
		$1::text[], $2::text[], array_fill(1, ARRAY[$3::int]), $4::bytea[], array_fill(-1::bigint, ARRAY[$3::int]),
		$5::bytea[], array_fill('00000000-0000-0000-0000-000000000000'::uuid, ARRAY[$3::int]),
		array_fill(0, ARRAY[$3::int]), true, NULL) ORDER BY ord`, qs, ps, k, hs, bs)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
		var st int16
		var off int64
		err := r.Scan(&st, &off)
		return [2]int64{int64(st), off}, err
	})
}

// Bundles over overlapping partition sets, each listing them in its own
// order, run beside transactions that lock the same rows in ascending id
// (as settlement and dead-letter requeues do): the bundles take their
// partitions' row locks in ascending id too, or two of these wait on each
// other (a deadlock, 40P01). Half the bundles also carry segments of a queue
// with a dedup window (push_one's path). Every segment is written once, at
// its partition's next offset. With push_bundle's row locks taken in
// descending id, this failed with 40P01 (checked with the resolve's lock
// and with the allocator's UPDATE taking the locks).
func TestBundleLockOrder(t *testing.T) {
	skipOnLayout(t, "push_routed locks row by row; this pins push_bundle's order")
	c := open(t)
	s := c.Schema()
	const parts = 40
	q := configure(t, c, "q", queen.QueueOptions{})
	w := configure(t, c, "w", queen.QueueOptions{DedupWindow: time.Hour})
	var all []string
	for _, qq := range []*queen.Queue{q, w} {
		var items []queen.Item
		for p := range parts {
			items = append(items, queen.Item{Partition: fmt.Sprintf("p%d", p), Data: []byte("x")})
			all = append(all, fmt.Sprintf("%s/p%d", qq.Name(), p))
		}
		push(t, qq, items...)
	}
	ctx := ctxT(t)
	pool := c.Pool()
	partsT := pgx.Identifier{s, "partitions"}.Sanitize()
	queuesT := pgx.Identifier{s, "queues"}.Sanitize()

	var mu sync.Mutex
	queued := map[string]int{}
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	subset := func(from []string, k int) []string {
		out := make([]string, 0, k)
		for _, i := range rand.Perm(len(from))[:k] {
			out = append(out, from[i])
		}
		return out
	}
	deadline := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for n := 0; n < 400 && time.Now().Before(deadline); n++ {
				// Half the bundles have no windowed segment (the
				// allocator's UPDATE takes the locks), half mix both.
				from := all[:parts]
				if (g+n)%2 == 1 {
					from = all
				}
				names := subset(from, 24)
				res, err := callBundle(ctx, pool, s, names)
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				for i, r := range res {
					if r[0] != 0 {
						firstErr = fmt.Errorf("%s: status %d", names[i], r[0])
					}
					queued[names[i]]++
				}
				mu.Unlock()
			}
		})
	}
	for range 3 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				names := subset(all, 24)
				qs := make([]string, len(names))
				ps := make([]string, len(names))
				for i, n := range names {
					qs[i], ps[i], _ = strings.Cut(n, "/")
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `SELECT count(*) FROM (SELECT p.id FROM `+partsT+` p
						JOIN `+queuesT+` qq ON qq.id = p.queue_id
						JOIN unnest($1::text[], $2::text[]) AS u(q, p) ON u.q = qq.name AND u.p = p.name
						ORDER BY p.id FOR NO KEY UPDATE OF p) l`, qs, ps); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `SELECT pg_sleep(0.002)`)
					return err
				})
				if err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	// Each partition: its first push's message, then every queued one, at
	// consecutive offsets.
	for _, n := range all {
		qn, pn, _ := strings.Cut(n, "/")
		var cnt, minOff, maxOff, last int64
		if err := pool.QueryRow(ctx, `SELECT count(*), min(sg.base_offset), max(sg.end_offset), max(p.last_offset)
			FROM `+partsT+` p JOIN `+queuesT+` qq ON qq.id = p.queue_id
			JOIN `+pgx.Identifier{s, "segments"}.Sanitize()+` sg ON sg.partition_id = p.id
			WHERE qq.name = $1 AND p.name = $2`, qn, pn).Scan(&cnt, &minOff, &maxOff, &last); err != nil {
			t.Fatal(err)
		}
		want := int64(queued[n] + 1)
		if cnt != want || minOff != 0 || maxOff != want-1 || last != want-1 {
			t.Fatalf("%s: %d segments at %d..%d, last offset %d; want %d at 0..%d", n, cnt, minOff, maxOff, last, want, want-1)
		}
	}
}
