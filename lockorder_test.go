package queen_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
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
// other (a deadlock, 40P01). A queue with a dedup window sends its segments
// through push_one, which locks before it probes: bundles with such a
// segment too. Every segment is written once, at its partition's next
// offset.
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

// The allocator's UPDATE takes its partitions' row locks in the order its
// plan visits them: a nested loop over the ascending array of partition ids,
// one primary-key probe each. TestBundleLockOrder fails when that order is
// not ascending; this fails when the plan changes shape (a sort, a hash or
// merge join, a scan of the table), which could change the order with a
// table or statistics the concurrent test does not see. The plan is the one
// push_bundle runs (auto_explain, nested statements, on this connection).
func TestBundleAllocatorPlan(t *testing.T) {
	skipOnLayout(t, "push_routed has no set-based allocator")
	c := open(t)
	s := c.Schema()
	q := configure(t, c, "q", queen.QueueOptions{})
	var items []queen.Item
	for p := range 5 {
		items = append(items, queen.Item{Partition: fmt.Sprintf("p%d", p), Data: []byte("x")})
	}
	push(t, q, items...)

	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Message)
		mu.Unlock()
	}
	ctx := ctxT(t)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, st := range []string{`LOAD 'auto_explain'`, `SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_nested_statements = on`, `SET auto_explain.log_level = 'notice'`,
		`SET auto_explain.log_format = 'json'`, `SET auto_explain.log_verbose = on`} {
		if _, err := conn.Exec(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	// The generic plan is made at the first call and kept: check it at the
	// first and at a later one.
	for call := range 3 {
		mu.Lock()
		notices = nil
		mu.Unlock()
		if _, err := callBundle(ctx, conn, s, []string{"q/p3", "q/p0", "q/p4", "q/p1"}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := notices
		mu.Unlock()
		var updates []map[string]any
		for _, m := range got {
			i := strings.Index(m, "{")
			if i < 0 {
				continue
			}
			var doc struct {
				Plan map[string]any `json:"Plan"`
			}
			if err := json.Unmarshal([]byte(m[i:]), &doc); err != nil {
				t.Fatalf("auto_explain notice: %v\n%s", err, m)
			}
			updates = append(updates, findNodes(doc.Plan, func(n map[string]any) bool {
				return n["Node Type"] == "ModifyTable" && n["Operation"] == "Update" && n["Relation Name"] == "partitions"
			})...)
		}
		if len(updates) != 1 {
			t.Fatalf("call %d: %d updates of partitions in the plans, want 1:\n%s", call, len(updates), strings.Join(got, "\n"))
		}
		plan, _ := json.MarshalIndent(updates[0], "", " ")
		kids, _ := updates[0]["Plans"].([]any)
		if len(kids) != 1 {
			t.Fatalf("call %d: the update has %d inputs:\n%s", call, len(kids), plan)
		}
		nl, _ := kids[0].(map[string]any)
		if nl["Node Type"] != "Nested Loop" {
			t.Fatalf("call %d: the update reads a %v, want a Nested Loop:\n%s", call, nl["Node Type"], plan)
		}
		nk, _ := nl["Plans"].([]any)
		if len(nk) != 2 {
			t.Fatalf("call %d: the nested loop has %d inputs:\n%s", call, len(nk), plan)
		}
		outer, _ := nk[0].(map[string]any)
		inner, _ := nk[1].(map[string]any)
		if outer["Parent Relationship"] != "Outer" || outer["Node Type"] != "Function Scan" ||
			!strings.HasPrefix(fmt.Sprint(outer["Function Call"]), "unnest(") {
			t.Fatalf("call %d: the outer side is not the array:\n%s", call, plan)
		}
		if inner["Parent Relationship"] != "Inner" || inner["Node Type"] != "Index Scan" ||
			inner["Index Name"] != "partitions_pkey" || inner["Relation Name"] != "partitions" {
			t.Fatalf("call %d: the inner side is not a primary-key probe:\n%s", call, plan)
		}
	}
}

func findNodes(n map[string]any, match func(map[string]any) bool) []map[string]any {
	var out []map[string]any
	if match(n) {
		out = append(out, n)
	}
	kids, _ := n["Plans"].([]any)
	for _, k := range kids {
		if m, ok := k.(map[string]any); ok {
			out = append(out, findNodes(m, match)...)
		}
	}
	return out
}
