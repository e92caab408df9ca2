package queen_test

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/citus"
	"github.com/e03140bc/queen/internal/pgtest"
)

// partitionIDs returns the ids of partition name of queue qname.
func partitionIDs(t *testing.T, c *queen.Client, qname, name string) []int64 {
	t.Helper()
	s := c.Schema()
	rows, err := c.Pool().Query(ctxT(t), `SELECT p.id FROM `+pgx.Identifier{s, "partitions"}.Sanitize()+` p
		JOIN `+pgx.Identifier{s, "queues"}.Sanitize()+` q ON q.id = p.queue_id
		WHERE q.name = $1 AND p.name = $2 ORDER BY p.id`, qname, name)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func queueID(t *testing.T, c *queen.Client, qname string) int64 {
	t.Helper()
	var id int64
	if err := c.Pool().QueryRow(ctxT(t), `SELECT id FROM `+pgx.Identifier{c.Schema(), "queues"}.Sanitize()+
		` WHERE name = $1`, qname).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// A new partition's id is derived from its queue's id and its name, as
// internal/citus computes it on the client: every way a push creates one
// (a bundle, a keyed lane, a scheduled move, a dead-letter requeue goes
// through the same add_partition).
func TestPartitionIDsDerivedFromNames(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "a", Data: []byte("1")}, queen.Item{Partition: "b", Data: []byte("2")})
	push(t, q, queen.Item{Key: "k", Data: []byte("3")})
	w := configure(t, c, "w", queen.QueueOptions{DedupWindow: time.Hour})
	push(t, w, queen.Item{Partition: "a", Data: []byte("4")})
	for _, p := range []struct{ q, name string }{{"q", "a"}, {"q", "b"}, {"w", "a"}} {
		want := citus.PartitionKey(queueID(t, c, p.q), p.name, 0)
		if ids := partitionIDs(t, c, p.q, p.name); len(ids) != 1 || ids[0] != want {
			t.Errorf("queue %s partition %s has ids %v, want [%d]", p.q, p.name, ids, want)
		}
	}
	var lane string
	if err := c.Pool().QueryRow(ctxT(t), `SELECT name FROM `+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
		` WHERE name LIKE 'lane-%'`).Scan(&lane); err != nil {
		t.Fatal(err)
	}
	if ids := partitionIDs(t, c, "q", lane); len(ids) != 1 || ids[0] != citus.PartitionKey(queueID(t, c, "q"), lane, 0) {
		t.Errorf("keyed lane %s has ids %v", lane, ids)
	}
}

// A collision, forced: another partition holds the id partition "b"
// derives. b takes its second probe, every push path finds it there (a
// bundle, the single-segment function with a dedup window, the isolated
// append), also once the first id is free again, and it is created once;
// with both ids taken, creating it fails rather than sharing a row. A
// partition created before derived ids (any other id) is found by name.
func TestPartitionIDCollision(t *testing.T) {
	for _, window := range []time.Duration{0, time.Hour} {
		t.Run(window.String(), func(t *testing.T) {
			c := open(t)
			q := configure(t, c, "q", queen.QueueOptions{DedupWindow: window})
			qid := queueID(t, c, "q")
			parts := pgx.Identifier{c.Schema(), "partitions"}.Sanitize()
			fn := func(n string) string { return pgx.Identifier{c.Schema(), n}.Sanitize() }
			exec := func(sql string, args ...any) {
				t.Helper()
				if _, err := c.Pool().Exec(ctxT(t), sql, args...); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			first, second := citus.PartitionKey(qid, "b", 0), citus.PartitionKey(qid, "b", 1)
			exec(`INSERT INTO `+parts+` (id, queue_id, name) VALUES ($1, $2, 'squatter'), (12345, $2, 'old')`, first, qid)

			push(t, q, queen.Item{Partition: "b", Data: []byte("b0")})
			if ids := partitionIDs(t, c, "q", "b"); len(ids) != 1 || ids[0] != second {
				t.Fatalf("b has ids %v, want its second probe [%d]", ids, second)
			}
			// Known to this client now: the isolated paths.
			push(t, q, queen.Item{Partition: "b", Data: []byte("b1")})
			push(t, q, queen.Item{Partition: "b", Data: []byte("b2")}, queen.Item{Partition: "old", Data: []byte("o0")})
			// A client that knows nothing: the bundle's provisioning.
			c2 := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
			push(t, c2.Queue("q"), queen.Item{Partition: "b", Data: []byte("b3")})
			push(t, c2.Queue("q"), queen.Item{Partition: "old", Data: []byte("o1")})

			// The first id free again (the squatter purged): b stays where it is.
			exec(`DELETE FROM `+parts+` WHERE id = $1`, first)
			var id int64
			var created bool
			if err := c.Pool().QueryRow(ctxT(t), `SELECT id, created FROM `+fn("add_partition")+`($1, 'b', -1)`, qid).Scan(&id, &created); err != nil {
				t.Fatal(err)
			}
			if id != second || created {
				t.Fatalf("add_partition of b after the squatter left = %d, %v; want %d, false", id, created, second)
			}
			c3 := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
			push(t, c3.Queue("q"), queen.Item{Partition: "b", Data: []byte("b4")})
			if ids := partitionIDs(t, c, "q", "b"); len(ids) != 1 || ids[0] != second {
				t.Fatalf("b has ids %v after the first id was freed, want [%d]", ids, second)
			}
			if ids := partitionIDs(t, c, "q", "old"); len(ids) != 1 || ids[0] != 12345 {
				t.Fatalf("old has ids %v, want [12345]", ids)
			}
			wantData(t, pop(t, q, queen.PopOptions{Partition: "b", Batch: 10, AutoAck: true}), "b0", "b1", "b2", "b3", "b4")
			wantData(t, pop(t, q, queen.PopOptions{Partition: "old", Batch: 10, AutoAck: true}), "o0", "o1")

			// Both ids of c taken: no row is shared.
			exec(`INSERT INTO `+parts+` (id, queue_id, name) VALUES ($1, $3, 'x'), ($2, $3, 'y')`,
				citus.PartitionKey(qid, "c", 0), citus.PartitionKey(qid, "c", 1), qid)
			if _, err := c.Pool().Exec(ctxT(t), `SELECT `+fn("add_partition")+`($1, 'c', -1)`, qid); err == nil {
				t.Fatal("add_partition of c with both its ids taken succeeded")
			}
			if ids := partitionIDs(t, c, "q", "c"); len(ids) != 0 {
				t.Fatalf("c has ids %v, want none", ids)
			}
		})
	}
}

// The routed form of push_bundle (settings.routed, which Distribute sets
// for the Citus layout) on PostgreSQL: the same pushes on a routed schema
// and a plain one give the same verdicts and leave the same rows (blobs
// aside: message ids differ). Bundles of many partitions, a partition twice
// in one bundle (PushTx), new partitions beside known ones, keyed lanes, a
// dedup window with a duplicate.
func TestPushRoutedMatchesSetBased(t *testing.T) {
	run := func(routed bool) (verdicts []string, rows []string) {
		c := open(t)
		if routed {
			if _, err := c.Pool().Exec(ctxT(t), `UPDATE `+pgx.Identifier{c.Schema(), "settings"}.Sanitize()+` SET routed = true`); err != nil {
				t.Fatal(err)
			}
		}
		rec := func(res []queen.PushResult) {
			for _, r := range res {
				verdicts = append(verdicts, fmt.Sprintf("%s %s %d", r.Status, r.Partition, r.Offset))
			}
		}
		q := c.Queue("q")
		var items []queen.Item
		for i := range 40 {
			items = append(items, queen.Item{Partition: fmt.Sprintf("p%d", i%7), Data: []byte("x")})
		}
		rec(push(t, q, items...))
		items = append(items, queen.Item{Partition: "new", Data: []byte("y")})
		rec(push(t, q, items...))
		rec(push(t, q, queen.Item{Partition: "p3", Data: []byte("z")}))
		for i := range 20 {
			items[i] = queen.Item{Key: fmt.Sprintf("k%d", i), Data: []byte("k")}
		}
		rec(push(t, c.Queue("keyed"), items[:20]...))
		err := pgx.BeginFunc(ctxT(t), c.Pool(), func(tx pgx.Tx) error {
			res, err := q.PushTx(ctxT(t), tx, []queen.Item{{Partition: "p1", Data: []byte("a")}, {Partition: "p2", Data: []byte("b")},
				{Partition: "p1", Data: []byte("c")}, {Partition: "tx-new", Data: []byte("d")}})
			rec(res)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		w := configure(t, c, "w", queen.QueueOptions{DedupWindow: time.Hour})
		rec(push(t, w, queen.Item{Partition: "a", TransactionID: "t1", Data: []byte("1")}, queen.Item{Partition: "b", TransactionID: "t2", Data: []byte("2")}))
		res, err := w.Push(ctxT(t), []queen.Item{{Partition: "a", TransactionID: "t1", Data: []byte("1")}, {Partition: "b", TransactionID: "t3", Data: []byte("3")}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range res {
			res[i].Offset = max(res[i].Offset, -1)
		}
		rec(res)
		s := c.Schema()
		r, err := c.Pool().Query(ctxT(t), `SELECT q.name || ' ' || p.name || ' ' || p.last_offset || ' ' || p.pending || ' ' ||
				coalesce((SELECT string_agg(sg.base_offset || '-' || sg.end_offset || '/' || sg.failures, ',' ORDER BY sg.base_offset)
				          FROM `+pgx.Identifier{s, "segments"}.Sanitize()+` sg WHERE sg.partition_id = p.id), '') || ' ' ||
				coalesce((SELECT string_agg(tx.base_offset || '-' || tx.end_offset, ',' ORDER BY tx.base_offset)
				          FROM `+pgx.Identifier{s, "txns"}.Sanitize()+` tx WHERE tx.partition_id = p.id), '')
			FROM `+pgx.Identifier{s, "partitions"}.Sanitize()+` p JOIN `+pgx.Identifier{s, "queues"}.Sanitize()+` q ON q.id = p.queue_id
			ORDER BY q.name, p.name`)
		if err != nil {
			t.Fatal(err)
		}
		rows, err = pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return verdicts, rows
	}
	v1, r1 := run(false)
	v2, r2 := run(true)
	if fmt.Sprint(v1) != fmt.Sprint(v2) {
		t.Errorf("verdicts:\n set-based %v\n routed    %v", v1, v2)
	}
	if fmt.Sprint(r1) != fmt.Sprint(r2) {
		t.Errorf("rows:\n set-based %q\n routed    %q", r1, r2)
	}
	if len(r1) < 10 {
		t.Fatalf("only %d partitions", len(r1))
	}
}

// No statement the push functions run is planned at a cost that
// PostgreSQL's default jit_above_cost (100,000) would JIT-compile on every
// call: push_bundle denies sequential scans, and a statement left with one
// (its cost then carries the penalty) cost 40-90 ms a call. auto_explain
// reports every nested statement's plan.
func TestPushPlansBelowJITCost(t *testing.T) {
	skipOnLayout(t, "it calls push_bundle, PostgreSQL's form; the layout pushes through push_routed")
	c := open(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "a", Data: []byte("1")}, queen.Item{Partition: "b", Data: []byte("2")})
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var plans []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		plans = append(plans, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, s := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice"} {
		if _, err := conn.Exec(ctxT(t), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	fn := func(n string) string { return pgx.Identifier{c.Schema(), n}.Sanitize() }
	h := func(b byte) []byte { return bytes.Repeat([]byte{b}, 16) }
	tenant := queen.DefaultTenant
	for _, known := range []bool{false, true} {
		if _, err := conn.Exec(ctxT(t), `SELECT * FROM `+fn("push_bundle")+`($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			[]string{"q", "q", "q"}, []string{"a", "b", "new"}, []int32{1, 1, 1}, [][]byte{h(1), h(2), h(3)},
			[]int64{-1, -1, -1}, [][]byte{{0}, {0}, {0}}, []uuid.UUID{tenant, tenant, tenant}, []int32{0, 0, 0}, known); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctxT(t), `SELECT * FROM `+fn("push_segment")+`($1, 'q', 'a', 1, $2, '\x00', 0, 0)`, tenant, h(4)); err != nil {
		t.Fatal(err)
	}
	cost := regexp.MustCompile(`cost=[0-9.]+\.\.([0-9.]+)`)
	mu.Lock()
	defer mu.Unlock()
	if len(plans) < 10 {
		t.Fatalf("%d plans reported, want the nested statements'", len(plans))
	}
	for _, p := range plans {
		if m := cost.FindStringSubmatch(p); m != nil {
			if v, _ := strconv.ParseFloat(m[1], 64); v >= 100000 {
				t.Errorf("a push statement planned at cost %s (JIT-compiled at the default settings):\n%s", m[1], p)
			}
		}
	}
}
