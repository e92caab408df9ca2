package queen_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/citus"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/sqlschema"
)

// citusURL is $QUEEN_TEST_CITUS_URL, a Citus coordinator with workers
// (internal/citus/cluster.sh starts one); the test skips without it, also
// in CI.
func citusURL(t *testing.T) string {
	u := os.Getenv("QUEEN_TEST_CITUS_URL")
	if u == "" {
		t.Skip("QUEEN_TEST_CITUS_URL not set (internal/citus/cluster.sh start DIR prints one)")
	}
	return u
}

// openCitus opens a client on a fresh schema of the coordinator at url,
// dropped when the test ends, with Config.Citus set to citus, and a pool on
// the coordinator.
func openCitus(t *testing.T, url string, citus bool, mod ...func(*queen.Config)) (*queen.Client, *pgxpool.Pool, string) {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	schema := "qc_" + hex.EncodeToString(b[:])
	pool, err := pgxpool.New(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		pool.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := queen.Config{DatabaseURL: url, Schema: schema, Citus: citus,
		Logger: pgtest.Logger(t), SpoolDir: t.TempDir()}
	for _, f := range mod {
		f(&cfg)
	}
	c, err := queen.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c, pool, schema
}

// twoPhase counts the two-phase commits the coordinator has recorded in
// pg_dist_transaction (one row per worker of each; the gid without its
// connection suffix names the transaction). Exact only while background
// recovery, which prunes the table, is off (cluster.sh turns it off); the
// test skips its 2PC assertions otherwise.
func twoPhase(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(ctxT(t), `SELECT count(DISTINCT regexp_replace(gid, '_[0-9]+$', ''))
		FROM pg_dist_transaction`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// countable skips t unless 2PC recovery is off on the coordinator.
func countable(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var iv string
	if err := pool.QueryRow(ctxT(t), "SHOW citus.recover_2pc_interval").Scan(&iv); err != nil {
		t.Fatal(err)
	}
	if iv != "-1" {
		t.Skipf("citus.recover_2pc_interval is %s: two-phase commits cannot be counted (cluster.sh sets -1)", iv)
	}
}

// TestOnCitus runs against a Citus coordinator with workers
// ($QUEEN_TEST_CITUS_URL). Coordinator: the deployment supported today,
// tables local to the coordinator: push, consume and keyed lanes work and
// take no two-phase commit. Layout: Config.Citus distributes the schema.
// DistributedPush: pushes on that layout, without 2PC within one worker.
// Routing: on that layout, what the client-side grouping by shard relies
// on: a transaction that writes one partition's rows (its allocator row,
// segments, cursor) commits on one worker without 2PC, one that spans
// partitions on two workers takes 2PC.
// On plain PostgreSQL, Config.Citus makes Open fail with ErrNoCitus (and
// the schema stays usable without it).
func TestOpenCitusWithoutCitus(t *testing.T) {
	skipOnLayout(t, "it needs a database without Citus")
	url, schema := pgtest.URL(t), pgtest.Schema(t)
	_, err := queen.Open(ctxT(t), queen.Config{DatabaseURL: url, Schema: schema, Citus: true,
		Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if !errors.Is(err, queen.ErrNoCitus) {
		t.Fatalf("Open with Citus on PostgreSQL = %v, want ErrNoCitus", err)
	}
	c := open(t, func(c *queen.Config) { c.Schema, c.Citus = schema, false })
	pushN(t, c.Queue("q"), "", "m", 1)
	wantData(t, pop(t, c.Queue("q"), queen.PopOptions{}), "m0")
}

func TestOnCitus(t *testing.T) {
	url := citusURL(t)

	t.Run("Coordinator", func(t *testing.T) {
		c, pool, _ := openCitus(t, url, false)
		countable(t, pool)
		before := twoPhase(t, pool)
		q := c.Queue("plain")
		// 100,000 pushes and pops: the measure the issue names.
		const parts, per = 100, 1000
		batch := make([]queen.Item, 0, 1000)
		for i := range per {
			for p := range parts {
				batch = append(batch, queen.Item{Partition: fmt.Sprintf("p%02d", p), Data: []byte(strconv.Itoa(i))})
				if len(batch) == cap(batch) {
					push(t, q, batch...)
					batch = batch[:0]
				}
			}
		}
		keyed := c.Queue("keyed")
		items := make([]queen.Item, 0, 200)
		for i := range 200 {
			items = append(items, queen.Item{Key: fmt.Sprintf("k%d", i%10), Data: []byte(strconv.Itoa(i / 10))})
		}
		res := push(t, keyed, items...)
		lanes := map[string]string{}
		for i, r := range res {
			k := items[i].Key
			if l, ok := lanes[k]; ok && l != r.Partition {
				t.Fatalf("key %s went to lanes %s and %s", k, l, r.Partition)
			}
			lanes[k] = r.Partition
		}
		var mu sync.Mutex
		next := map[string]int{}
		n := 0
		err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 1000, Wait: 100 * time.Millisecond}, Concurrency: 4},
			func(_ context.Context, m *queen.Message) error {
				mu.Lock()
				defer mu.Unlock()
				if m.Offset != int64(next[m.Partition]) {
					t.Errorf("partition %s: offset %d handled, want %d", m.Partition, m.Offset, next[m.Partition])
				}
				next[m.Partition]++
				n++
				return nil
			}, func() bool { mu.Lock(); defer mu.Unlock(); return n >= parts*per })
		if err != nil || n != parts*per {
			t.Fatalf("Consume = %v after %d of %d", err, n, parts*per)
		}
		keyNext := map[string]int{}
		n = 0
		err = consumeUntil(t, keyed, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, Wait: 100 * time.Millisecond}, Concurrency: 4, KeyConcurrency: 2},
			func(_ context.Context, m *queen.Message) error {
				mu.Lock()
				defer mu.Unlock()
				if want := strconv.Itoa(keyNext[m.Key]); string(m.Data) != want {
					t.Errorf("key %s: %s handled, want %s", m.Key, m.Data, want)
				}
				keyNext[m.Key]++
				n++
				return nil
			}, func() bool { mu.Lock(); defer mu.Unlock(); return n >= len(items) })
		if err != nil || n != len(items) {
			t.Fatalf("keyed Consume = %v after %d of %d", err, n, len(items))
		}
		d := twoPhase(t, pool) - before
		t.Logf("%d two-phase commits for %d pushes and pops", d, parts*per+len(items))
		if d != 0 {
			t.Fatalf("%d two-phase commits for %d pushes and pops on coordinator-local tables, want 0", d, parts*per+len(items))
		}
	})

	t.Run("Layout", func(t *testing.T) {
		_, pool, schema := openCitus(t, url, true)
		ok, err := sqlschema.Distributed(ctxT(t), pool, schema)
		if err != nil || !ok {
			t.Fatalf("Distributed = %v, %v; want true", ok, err)
		}
		rows, err := pool.Query(ctxT(t), `SELECT c.relname, p.partmethod::text,
				coalesce(column_to_column_name(p.logicalrelid, p.partkey), ''),
				p.colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = $2::regclass)
			FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
			WHERE c.relnamespace = $1::regnamespace`, pgx.Identifier{schema}.Sanitize(), pgx.Identifier{schema, "partitions"}.Sanitize())
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for rows.Next() {
			var rel, method, col string
			var coloc bool
			if err := rows.Scan(&rel, &method, &col, &coloc); err != nil {
				t.Fatal(err)
			}
			got[rel] = fmt.Sprintf("%s %s %v", method, col, coloc)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for _, r := range sqlschema.CitusReference {
			if got[r] != "n  false" {
				t.Errorf("%s: %q, want a reference table", r, got[r])
			}
		}
		for i, d := range sqlschema.CitusDistributed {
			want := "h partition_id true"
			if i == 0 {
				want = "h id true"
			}
			if got[d] != want {
				t.Errorf("%s: %q, want hash-distributed, co-located with partitions (%q)", d, got[d], want)
			}
		}
		local := 0
		for r := range got {
			for _, l := range sqlschema.CitusLocal {
				if r == l || strings.HasPrefix(r, "scheduled_g") && r != "scheduled_gens" && l == "scheduled_gen" {
					local++ // the table or one of its partitions
				}
			}
		}
		if local == 0 {
			t.Errorf("no Citus local tables %v in %v", sqlschema.CitusLocal, got)
		}
		if len(got) != len(sqlschema.CitusReference)+len(sqlschema.CitusDistributed)+local {
			t.Errorf("Citus tables %v", got)
		}
		for _, r := range sqlschema.CitusCoordinator {
			if _, ok := got[r]; ok {
				t.Errorf("%s: %q, want a plain table of the coordinator", r, got[r])
			}
		}
		if err := sqlschema.Distribute(ctxT(t), pool, schema); err != nil {
			t.Fatalf("Distribute again: %v", err)
		}
		// A layout of an earlier release, members a reference table with
		// its foreign key, is brought to today's by Distribute.
		tbl := pgx.Identifier{schema, "members"}.Sanitize()
		for _, q := range []string{"SELECT create_reference_table('" + tbl + "')",
			"ALTER TABLE " + tbl + " ADD CONSTRAINT members_queue_id_fkey FOREIGN KEY (queue_id) REFERENCES " +
				pgx.Identifier{schema, "queues"}.Sanitize() + " (id) ON DELETE CASCADE"} {
			if _, err := pool.Exec(ctxT(t), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		if err := sqlschema.Distribute(ctxT(t), pool, schema); err != nil {
			t.Fatalf("Distribute an earlier layout: %v", err)
		}
		var n int
		if err := pool.QueryRow(ctxT(t), "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = $1::regclass",
			tbl).Scan(&n); err != nil || n != 0 {
			t.Fatalf("members in Citus's metadata after Distribute: %d, %v; want 0", n, err)
		}
	})

	// What already works on the distributed layout.
	t.Run("DistributedConfigure", func(t *testing.T) {
		c, _, _ := openCitus(t, url, true)
		q := c.Queue("conf")
		for _, lt := range []time.Duration{time.Minute, 2 * time.Minute} { // insert, then update
			if err := q.Configure(ctxT(t), queen.QueueOptions{LeaseTime: lt}); err != nil {
				t.Fatalf("Configure(LeaseTime %s): %v", lt, err)
			}
		}
	})

	// Push on the layout: after a partition's creation (a queue row and
	// key-share locks on the reference table: two-phase commits), isolated
	// pushes (push_segment), bundles over partitions of one worker
	// (push_bundle's routed form) and a dedup window's probe commit on one
	// worker without 2PC; a bundle over both workers takes one until the
	// client routes by worker (plan, step 2). First pushes of one new
	// partition from several clients at once create one row: the primary
	// key on the derived id stands for the unique (queue_id, name).
	t.Run("DistributedPush", func(t *testing.T) {
		// No maintenance: its passes write reference tables (and do not
		// run on the layout yet).
		noMaint := func(c *queen.Config) { c.Maintenance.Interval = -1 }
		c, pool, schema := openCitus(t, url, true, noMaint)
		countable(t, pool)
		tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
		shards, err := citus.Load(ctxT(t), pool, tbl("partitions"))
		if err != nil {
			t.Fatal(err)
		}
		q := c.Queue("dp")
		w := c.Queue("dw")
		if err := w.Configure(ctxT(t), queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
			t.Fatal(err)
		}
		start := twoPhase(t, pool)
		push(t, q, queen.Item{Partition: "seed", Data: []byte("s")})
		var qid int64
		if err := pool.QueryRow(ctxT(t), "SELECT id FROM "+tbl("queues")+" WHERE name = 'dp'").Scan(&qid); err != nil {
			t.Fatal(err)
		}
		// Eight partition names on each worker group, by the client's
		// own reckoning of their ids.
		byGroup := map[int32][]string{}
		for i := 0; len(byGroup) < 2 || len(byGroup[shards[0].Group]) < 8 || len(byGroup[shards[len(shards)-1].Group]) < 8; i++ {
			name := fmt.Sprint("k", i)
			sh, ok := shards.Of(citus.PartitionKey(qid, name, 0))
			if !ok {
				t.Fatalf("no shard for %s", name)
			}
			byGroup[sh.Group] = append(byGroup[sh.Group], name)
		}
		one, other := byGroup[shards[0].Group][:8], byGroup[shards[len(shards)-1].Group][:8]
		items := func(names []string, per int) []queen.Item {
			var out []queen.Item
			for i := range per {
				for _, n := range names {
					out = append(out, queen.Item{Partition: n, Data: []byte(strconv.Itoa(i))})
				}
			}
			return out
		}
		push(t, q, items(one, 1)...)
		push(t, q, items(other, 1)...)
		push(t, w, queen.Item{Partition: one[0], TransactionID: "t0", Data: []byte("w")})
		created := twoPhase(t, pool) - start

		before := twoPhase(t, pool)
		const isolated, bundles = 100, 50
		for i := range isolated {
			push(t, q, queen.Item{Partition: one[i%2], Data: []byte(strconv.Itoa(i))})
		}
		for range bundles / 2 {
			push(t, q, items(one, 4)...)
			push(t, q, items(other, 4)...)
		}
		for i := range 20 {
			push(t, w, queen.Item{Partition: one[0], TransactionID: fmt.Sprint("t", i+1), Data: []byte("w")})
		}
		res, err := w.Push(ctxT(t), []queen.Item{{Partition: one[0], TransactionID: "t3", Data: []byte("again")}})
		if err != nil || res[0].Status != queen.Duplicate {
			t.Fatalf("a repeated transaction id: %+v, %v; want a duplicate", res, err)
		}
		d := twoPhase(t, pool) - before
		t.Logf("two-phase commits: %d creating the queues and 17 partitions; %d for %d isolated pushes, %d bundles of 8 partitions of one worker, 21 pushes with a dedup window",
			created, d, isolated, bundles)
		if d != 0 {
			t.Errorf("%d two-phase commits for pushes of one worker's partitions, want 0", d)
		}
		// One transaction over both workers (PushTx: one bundle).
		before = twoPhase(t, pool)
		if err := pgx.BeginFunc(ctxT(t), pool, func(tx pgx.Tx) error {
			_, err := q.PushTx(ctxT(t), tx, append(items(one[:1], 1), items(other[:1], 1)...))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if d := twoPhase(t, pool) - before; d != 1 {
			t.Errorf("a bundle over both workers: %d two-phase commits, want 1", d)
		}

		// Every message in its partition, offsets from 0 without a gap.
		want := map[string]int64{"seed": 1}
		for _, n := range append(append([]string{}, one...), other...) {
			want[n] = 1 + bundles/2*4
		}
		want[one[0]] += isolated / 2
		want[one[1]] += isolated / 2
		want[one[0]]++
		want[other[0]]++
		rows, err := pool.Query(ctxT(t), `SELECT p.name, p.last_offset, coalesce(sum(s.end_offset - s.base_offset + 1), 0), coalesce(min(s.base_offset), 0)
			FROM `+tbl("partitions")+` p LEFT JOIN `+tbl("segments")+` s ON s.partition_id = p.id
			WHERE p.queue_id = $1 GROUP BY p.id, p.name, p.last_offset`, qid)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var name string
			var last, msgs, first int64
			if err := rows.Scan(&name, &last, &msgs, &first); err != nil {
				t.Fatal(err)
			}
			n++
			if msgs != want[name] || last != msgs-1 || first != 0 {
				t.Errorf("partition %s: %d messages, last offset %d, first %d; want %d from 0", name, msgs, last, first, want[name])
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n != len(want) {
			t.Errorf("%d partitions, want %d", n, len(want))
		}

		// Several clients' first pushes of one new partition.
		var wg sync.WaitGroup
		for i := range 4 {
			cfg := queen.Config{DatabaseURL: url, Schema: schema, Citus: true,
				Logger: pgtest.Logger(t), SpoolDir: t.TempDir()}
			noMaint(&cfg)
			cl, err := queen.Open(ctxT(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close(context.Background())
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := cl.Queue("race").Push(ctxT(t), []queen.Item{{Partition: "new", Data: []byte(strconv.Itoa(i))}}); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		var parts, msgs int
		if err := pool.QueryRow(ctxT(t), `SELECT count(DISTINCT p.id), count(s.*) FROM `+tbl("partitions")+` p
			JOIN `+tbl("queues")+` q ON q.id = p.queue_id LEFT JOIN `+tbl("segments")+` s ON s.partition_id = p.id
			WHERE q.name = 'race'`).Scan(&parts, &msgs); err != nil {
			t.Fatal(err)
		}
		if parts != 1 || msgs != 4 {
			t.Errorf("four first pushes of one partition: %d partitions, %d segments; want 1, 4", parts, msgs)
		}
	})

	// The operator and status calls on the layout, each with its effect
	// asserted: ResetGroup, Status, ReleaseLease against a lease set on a
	// cursor, DeadLetters and DiscardDeadLetters, maintenance (retention,
	// the samples ring), DeleteGroup and Queue.Delete, which leaves no
	// row of the queue on any worker. The state consuming would make is
	// written with the engine's own functions (insert_dead_letters) or,
	// for the lease, as a claim writes it, since consuming is another
	// slice's. Their two-phase commits are logged: reads take none.
	t.Run("DistributedOps", func(t *testing.T) {
		c, pool, schema := openCitus(t, url, true, func(c *queen.Config) {
			c.Maintenance.Interval, c.Maintenance.HashFloor, c.Maintenance.IdlePartition = -1, time.Millisecond, time.Hour
		})
		countable(t, pool)
		ctx := ctxT(t)
		tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
		shards, err := citus.Load(ctx, pool, tbl("partitions"))
		if err != nil {
			t.Fatal(err)
		}
		q := c.Queue("ops")
		pushN(t, q, "seed", "m", 1)
		var qid int64
		if err := pool.QueryRow(ctx, "SELECT id FROM "+tbl("queues")+" WHERE name = 'ops'").Scan(&qid); err != nil {
			t.Fatal(err)
		}
		// Three partitions on each worker group besides "seed".
		byGroup := map[int32][]string{}
		var names []string
		pids := map[string]int64{"seed": citus.PartitionKey(qid, "seed", 0)}
		for i := 0; len(names) < 6; i++ {
			name := fmt.Sprint("p", i)
			id := citus.PartitionKey(qid, name, 0)
			sh, ok := shards.Of(id)
			if !ok {
				t.Fatalf("no shard for %s", name)
			}
			if len(byGroup[sh.Group]) < 3 {
				byGroup[sh.Group] = append(byGroup[sh.Group], name)
				names = append(names, name)
				pids[name] = id
			}
		}
		if len(byGroup) != 2 {
			t.Fatalf("partitions on %d worker groups, want 2", len(byGroup))
		}
		for _, n := range names {
			pushN(t, q, n, n+"-", 3)
		}
		a, b := names[0], names[3] // one on each worker
		step := func(what string, f func()) {
			t.Helper()
			before := twoPhase(t, pool)
			f()
			t.Logf("%s: %d two-phase commits", what, twoPhase(t, pool)-before)
		}

		var moves []queen.OffsetMove
		step("ResetGroup (subscribes, 7 cursors)", func() {
			moves, err = q.ResetGroup(ctx, "g", queen.ResetEarliest(), queen.ResetOptions{})
		})
		if err != nil || len(moves) != 7 {
			t.Fatalf("ResetGroup = %+v, %v; want 7 moves", moves, err)
		}
		for _, m := range moves {
			if !m.Created || m.After != -1 || m.LeaseEnded {
				t.Errorf("ResetGroup earliest: %+v, want a created cursor at -1", m)
			}
		}
		moves, err = q.ResetGroup(ctx, "g", queen.ResetToOffsets(map[string]int64{a: 2}), queen.ResetOptions{})
		if err != nil || len(moves) != 1 || moves[0] != (queen.OffsetMove{Partition: a, Before: -1, After: 1}) {
			t.Fatalf("ResetToOffsets(%s: 2) = %+v, %v", a, moves, err)
		}
		if _, err := q.ResetGroup(ctx, "g", queen.ResetLatest(), queen.ResetOptions{Partitions: []string{"nope"}}); !errors.Is(err, queen.ErrNotFound) {
			t.Errorf("ResetGroup on a partition that does not exist: %v, want ErrNotFound", err)
		}

		status := func() map[string]queen.PartitionStatus {
			t.Helper()
			var st queen.QueueStatus
			step("Status", func() { st, err = q.Status(ctx) })
			if err != nil {
				t.Fatalf("Status: %v", err)
			}
			out := map[string]queen.PartitionStatus{}
			for _, p := range st.Partitions {
				out[p.Name] = p
			}
			if len(out) != 7 || len(st.Partitions) != 7 {
				t.Fatalf("Status: %d partitions, want 7", len(st.Partitions))
			}
			return out
		}
		st := status()
		for _, n := range names {
			p := st[n]
			if p.LastOffset != 2 || p.LogStart != 0 || len(p.Groups) != 1 || p.Groups[0].Group != "g" {
				t.Fatalf("Status of %s: %+v", n, p)
			}
			g, want := p.Groups[0], int64(-1)
			if n == a {
				want = 1
			}
			if g.Committed != want || g.Lag != 2-want || g.LagAge <= 0 || g.Leased {
				t.Errorf("Status of %s, group g: %+v; want committed %d, lag %d", n, g, want, 2-want)
			}
		}

		// A live lease on b's cursor, as a claim writes it.
		if _, err := pool.Exec(ctx, "UPDATE "+tbl("consumers")+` SET batch_end = 0, lease_id = $3::uuid,
				lease_owner = 'test-holder', lease_expires_at = $2, deliveries = 1
			WHERE partition_id = $1 AND group_name = 'g'`, pids[b], time.Now().Add(time.Minute), "4f8b2c1e-0000-4000-8000-000000000001"); err != nil {
			t.Fatal(err)
		}
		if g := status()[b].Groups[0]; !g.Leased || g.LeaseEnd != 0 || g.LeaseOwner != "test-holder" {
			t.Errorf("Status of a leased cursor: %+v", g)
		}
		if _, err := q.ResetGroup(ctx, "g", queen.ResetEarliest(), queen.ResetOptions{}); !errors.Is(err, queen.ErrGroupActive) {
			t.Errorf("ResetGroup with a live lease: %v, want ErrGroupActive", err)
		}
		if _, err := q.DeleteGroup(ctx, "g", queen.DeleteGroupOptions{}); !errors.Is(err, queen.ErrGroupActive) {
			t.Errorf("DeleteGroup with a live lease: %v, want ErrGroupActive", err)
		}
		var released bool
		step("ReleaseLease", func() { released, err = q.ReleaseLease(ctx, "g", b) })
		if err != nil || !released {
			t.Fatalf("ReleaseLease = %v, %v; want true", released, err)
		}
		if released, err = q.ReleaseLease(ctx, "g", b); err != nil || released {
			t.Errorf("ReleaseLease again = %v, %v; want false", released, err)
		}
		if _, err := q.ReleaseLease(ctx, "g", "nope"); !errors.Is(err, queen.ErrNotFound) {
			t.Errorf("ReleaseLease of a partition that does not exist: %v, want ErrNotFound", err)
		}
		var deliveries int
		if err := pool.QueryRow(ctx, "SELECT deliveries FROM "+tbl("consumers")+" WHERE partition_id = $1 AND group_name = 'g'",
			pids[b]).Scan(&deliveries); err != nil || deliveries != 0 {
			t.Errorf("deliveries after the release: %d, %v; want 0", deliveries, err)
		}
		if g := status()[b].Groups[0]; g.Leased {
			t.Errorf("Status after ReleaseLease: %+v, want no lease", g)
		}
		step("ResetGroup latest on one partition (Force)", func() {
			moves, err = q.ResetGroup(ctx, "g", queen.ResetLatest(), queen.ResetOptions{Partitions: []string{b}, Force: true})
		})
		if err != nil || len(moves) != 1 || moves[0] != (queen.OffsetMove{Partition: b, Before: -1, After: 2}) {
			t.Fatalf("ResetLatest(%s) = %+v, %v", b, moves, err)
		}

		// Dead letters of a, stored by the engine's own function.
		if _, err := pool.Exec(ctx, `SELECT `+tbl("insert_dead_letters")+`($1, $2, $3, 'g', '{0,1,2}', '{1,2,3}',
				`+tbl("dead_letter_snapshots")+`('test', 3, NULL, ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid()],
					'{t0,t1,t2}', '{0,0,0}', ARRAY['\x00'::bytea, '\x01', '\x02'], ARRAY[now(), now(), now()], NULL, NULL, '{r0,r1,r2}'))`,
			qid, pids[a], a); err != nil {
			t.Fatal(err)
		}
		var dls []queen.DeadLetter
		step("DeadLetters", func() { dls, err = q.DeadLetters(ctx, queen.DeadLetterQuery{}) })
		if err != nil || len(dls) != 3 {
			t.Fatalf("DeadLetters = %d, %v; want 3", len(dls), err)
		}
		for i, d := range dls {
			if d.Partition != a || d.Group != "g" || d.Offset != int64(i) || d.Attempts != i+1 || d.Reason != fmt.Sprint("r", i) ||
				d.TransactionID != fmt.Sprint("t", i) || (i > 0 && d.ID <= dls[i-1].ID) {
				t.Errorf("dead letter %d: %+v", i, d)
			}
		}
		if page, err := q.DeadLetters(ctx, queen.DeadLetterQuery{After: dls[0].ID, Limit: 1}); err != nil || len(page) != 1 || page[0].ID != dls[1].ID {
			t.Errorf("DeadLetters after the first, one: %+v, %v", page, err)
		}
		if page, err := q.DeadLetters(ctx, queen.DeadLetterQuery{Partition: b}); err != nil || len(page) != 0 {
			t.Errorf("DeadLetters of %s: %d, %v; want none", b, len(page), err)
		}
		var n int
		step("DiscardDeadLetters", func() { n, err = q.DiscardDeadLetters(ctx, queen.DeadLetterQuery{Limit: 2}) })
		if err != nil || n != 2 {
			t.Fatalf("DiscardDeadLetters(Limit 2) = %d, %v; want 2", n, err)
		}
		if left, err := q.DeadLetters(ctx, queen.DeadLetterQuery{}); err != nil || len(left) != 1 || left[0].ID != dls[2].ID {
			t.Errorf("DeadLetters after the discard: %+v, %v; want the third", left, err)
		}

		// Maintenance: the samples ring, then retention.
		var rep queen.MaintenanceReport
		step("Maintain (samples)", func() { rep, err = c.Maintain(ctx) })
		if err != nil || rep.Samples != 1 {
			t.Fatalf("Maintain = %+v, %v; want one queue's sample", rep, err)
		}
		smp, err := q.Samples(ctx)
		if err != nil || len(smp.Samples) != 1 {
			t.Fatalf("Samples = %+v, %v", smp, err)
		}
		// g: 1 + 1 + 3 (a at 1, b at 2, every other at -1) consumed; lag
		// 1 on a, 0 on b, 3 on four partitions, 1 on seed.
		if s := smp.Samples[0]; s.Pushed != 19 || len(s.Groups) != 1 || s.Groups[0] != (queen.GroupSample{Group: "g", Consumed: 5, Lag: 14}) {
			t.Errorf("sample %+v, want 19 pushed, g consumed 5, lag 14", s)
		}
		var qs []queen.QueueInfo
		step("Queues", func() { qs, err = c.Queues(ctx) })
		if err != nil || len(qs) != 1 || qs[0].Name != "ops" || qs[0].Partitions != 7 || qs[0].Pushed != 19 ||
			qs[0].Depth != 14 || qs[0].OldestAge <= 0 || qs[0].DeadLetters != 1 || qs[0].LastDeadLetterID != dls[2].ID ||
			len(qs[0].Groups) != 1 || qs[0].Groups[0].Group != "g" || qs[0].Groups[0].Lag != 14 || qs[0].Groups[0].LagAge <= 0 {
			t.Errorf("Queues = %+v, %v; want ops: 7 partitions, 19 pushed, depth 14, one dead letter, g lagging 14", qs, err)
		}
		// Requeue: the dead letter left on a and one more on b (the other
		// worker) go back to their partitions' tails.
		if _, err := pool.Exec(ctx, `SELECT `+tbl("insert_dead_letters")+`($1, $2, $3, 'g', '{1}', '{1}',
				`+tbl("dead_letter_snapshots")+`('test', 1, NULL, ARRAY[gen_random_uuid()], '{tb}', '{0}', ARRAY['\x0b'::bytea],
					ARRAY[now()], NULL, NULL, '{rb}'))`, qid, pids[b], b); err != nil {
			t.Fatal(err)
		}
		step("RequeueDeadLetters", func() { n, err = q.RequeueDeadLetters(ctx, queen.DeadLetterQuery{}) })
		if err != nil || n != 2 {
			t.Fatalf("RequeueDeadLetters = %d, %v; want 2", n, err)
		}
		if left, err := q.DeadLetters(ctx, queen.DeadLetterQuery{}); err != nil || len(left) != 0 {
			t.Errorf("DeadLetters after the requeue: %d, %v; want none", len(left), err)
		}
		st = status()
		for _, n := range []string{a, b} {
			if st[n].LastOffset != 3 {
				t.Errorf("Status of %s after the requeue: last offset %d, want 3", n, st[n].LastOffset)
			}
		}
		if err := q.Configure(ctx, queen.QueueOptions{Retention: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		var segs int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl("segments")+" s JOIN "+tbl("partitions")+
			" p ON p.id = s.partition_id WHERE p.queue_id = $1", qid).Scan(&segs); err != nil || segs == 0 {
			t.Fatalf("segments: %d, %v", segs, err)
		}
		step("Maintain (retention)", func() { rep, err = c.Maintain(ctx) })
		if err != nil || rep.SegmentsDeleted != segs {
			t.Fatalf("Maintain = %+v, %v; want %d segments deleted", rep, err, segs)
		}
		for n, p := range status() {
			if p.LogStart != p.LastOffset+1 || p.Groups[0].Lag != 0 {
				t.Errorf("Status of %s after retention: %+v, want nothing retained, no lag", n, p)
			}
		}

		var gd queen.GroupDeleted
		step("DeleteGroup", func() { gd, err = q.DeleteGroup(ctx, "g", queen.DeleteGroupOptions{}) })
		if err != nil || gd != (queen.GroupDeleted{Cursors: 7}) {
			t.Fatalf("DeleteGroup = %+v, %v; want 7 cursors", gd, err)
		}
		for n, p := range status() {
			if len(p.Groups) != 0 {
				t.Errorf("Status of %s after DeleteGroup: %+v", n, p)
			}
		}
		if _, err := q.DeleteGroup(ctx, "g", queen.DeleteGroupOptions{}); !errors.Is(err, queen.ErrNotFound) {
			t.Errorf("DeleteGroup again: %v, want ErrNotFound", err)
		}

		// Delete: nothing of the queue left on any worker (every shard is
		// read through the coordinator).
		if _, err := q.ResetGroup(ctx, "h", queen.ResetEarliest(), queen.ResetOptions{}); err != nil {
			t.Fatal(err)
		}
		pushN(t, q, a, "again", 2)
		step("Queue.Delete", func() { err = q.Delete(ctx) })
		if err != nil {
			t.Fatalf("Delete: %v", err)
		}
		ids := make([]int64, 0, len(pids))
		for _, id := range pids {
			ids = append(ids, id)
		}
		for _, tb := range []string{"partitions", "segments", "txns", "consumers", "backlog"} {
			col := "partition_id"
			if tb == "partitions" {
				col = "id"
			}
			var left int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl(tb)+" WHERE "+col+" = ANY ($1)", ids).Scan(&left); err != nil || left != 0 {
				t.Errorf("%s: %d rows of the deleted queue, %v", tb, left, err)
			}
		}
		for _, tb := range []string{"queues", "subscriptions", "dead_letters", "samples"} {
			col := "queue_id"
			if tb == "queues" {
				col = "id"
			}
			var left int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl(tb)+" WHERE "+col+" = $1", qid).Scan(&left); err != nil || left != 0 {
				t.Errorf("%s: %d rows of the deleted queue, %v", tb, left, err)
			}
		}
		if st, err := q.Status(ctx); err != nil || len(st.Partitions) != 0 {
			t.Errorf("Status of the deleted queue: %+v, %v", st, err)
		}

		// Trimming: retention keeps the hashes of the segments it deletes
		// inside the dedup window as hash rows (a segment carries its
		// hashes), which the purge deletes once past it; then the
		// partition emptied by retention and idle for longer than
		// IdlePartition.
		const window = 3 * time.Second
		tq := c.Queue("trim")
		if err := tq.Configure(ctx, queen.QueueOptions{DedupWindow: window, LeaseTime: time.Millisecond,
			Retention: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		pushed := time.Now()
		push(t, tq, queen.Item{Partition: "t", TransactionID: "a"})
		push(t, tq, queen.Item{Partition: "t", TransactionID: "b"})
		time.Sleep(5 * time.Millisecond)
		step("Maintain (retention)", func() { rep, err = c.Maintain(ctx) })
		if err != nil || rep.SegmentsDeleted != 2 || rep.HashRowsDeleted != 0 {
			t.Fatalf("Maintain = %+v, %v; want 2 segments deleted and their hash rows kept", rep, err)
		}
		if time.Since(pushed) < window/2 { // else the repeat might land past the window
			if r := push(t, tq, queen.Item{Partition: "t", TransactionID: "a"})[0]; r.Status != queen.Duplicate {
				t.Errorf("a repeat inside the window after retention: %s, want Duplicate", r.Status)
			}
		}
		time.Sleep(time.Until(pushed.Add(window + 100*time.Millisecond)))
		step("Maintain (hash rows)", func() { rep, err = c.Maintain(ctx) })
		if err != nil || rep.HashRowsDeleted != 2 {
			t.Fatalf("Maintain = %+v, %v; want 2 hash rows deleted", rep, err)
		}
		var tqid int64
		if err := pool.QueryRow(ctx, "SELECT id FROM "+tbl("queues")+" WHERE name = 'trim'").Scan(&tqid); err != nil {
			t.Fatal(err)
		}
		tpid := citus.PartitionKey(tqid, "t", 0)
		if _, err := pool.Exec(ctx, "UPDATE "+tbl("partitions")+" SET last_write_at = $2 WHERE id = $1",
			tpid, time.Now().Add(-2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		step("Maintain (idle partition)", func() { rep, err = c.Maintain(ctx) })
		if err != nil || rep.PartitionsPurged != 1 {
			t.Fatalf("Maintain = %+v, %v; want the idle partition purged", rep, err)
		}
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl("partitions")+" WHERE id = $1", tpid).Scan(&left); err != nil || left != 0 {
			t.Errorf("the idle partition: %d rows left, %v", left, err)
		}

		// A pass with nothing to do writes nothing, so takes no two-phase
		// commit (one in a new bucket of the samples ring writes it: one of
		// two passes in a row may).
		idle := int64(-1)
		for range 2 {
			before := twoPhase(t, pool)
			if _, err := c.Maintain(ctx); err != nil {
				t.Fatal(err)
			}
			if d := twoPhase(t, pool) - before; idle < 0 || d < idle {
				idle = d
			}
		}
		if idle != 0 {
			t.Errorf("an idle maintenance pass took %d two-phase commits, want 0", idle)
		}
	})

	t.Run("DistributedPushSpansWorkers", func(t *testing.T) {
		// Pushes whose items fall on both workers: fusion's bundles mix
		// partitions of both, and the client splits each by worker, so
		// none takes a two-phase commit once it knows the queue's id.
		c, pool, schema := openCitus(t, url, true, func(c *queen.Config) { c.Maintenance.Interval = -1 })
		countable(t, pool)
		tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
		shards, err := citus.Load(ctxT(t), pool, tbl("partitions"))
		if err != nil {
			t.Fatal(err)
		}
		q := c.Queue("span")
		push(t, q, queen.Item{Partition: "seed", Data: []byte("s")})
		var qid int64
		if err := pool.QueryRow(ctxT(t), "SELECT id FROM "+tbl("queues")+" WHERE name = 'span'").Scan(&qid); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for queen.CachedQueueID(c, "span") != qid {
			if time.Now().After(deadline) {
				t.Fatalf("the client did not learn the queue's id %d after its first push (has %d)", qid, queen.CachedQueueID(c, "span"))
			}
			time.Sleep(10 * time.Millisecond)
		}
		const per = 24
		byGroup := map[int32][]string{}
		for i := 0; len(byGroup[shards[0].Group]) < per || len(byGroup[shards[len(shards)-1].Group]) < per; i++ {
			name := fmt.Sprint("p", i)
			sh, _ := shards.Of(citus.PartitionKey(qid, name, 0))
			byGroup[sh.Group] = append(byGroup[sh.Group], name)
		}
		names := append(append([]string{}, byGroup[shards[0].Group][:per]...), byGroup[shards[len(shards)-1].Group][:per]...)
		// Every partition's first push (partition rows: reference locks).
		var first []queen.Item
		for _, n := range names {
			first = append(first, queen.Item{Partition: n, Data: []byte("0")})
		}
		push(t, q, first...)

		before := twoPhase(t, pool)
		const pushes, callers = 30, 4
		var wg sync.WaitGroup
		for g := range callers {
			wg.Go(func() {
				for i := range pushes {
					var items []queen.Item
					for _, n := range names {
						items = append(items, queen.Item{Partition: n, Data: []byte(fmt.Sprint(g, "-", i))})
					}
					res, err := q.Push(ctxT(t), items)
					if err != nil {
						t.Error(err)
						return
					}
					for _, r := range res {
						if r.Status != queen.Queued {
							t.Errorf("push over both workers: %+v", r)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		d := twoPhase(t, pool) - before
		t.Logf("two-phase commits: %d for %d pushes of %d partitions over two workers", d, pushes*callers, len(names))
		if d != 0 {
			t.Errorf("%d two-phase commits for pushes over two workers' partitions, want 0", d)
		}
		// Every message in its partition, offsets from 0 without a gap.
		rows, err := pool.Query(ctxT(t), `SELECT p.name, p.last_offset, coalesce(sum(s.end_offset - s.base_offset + 1), 0)
			FROM `+tbl("partitions")+` p LEFT JOIN `+tbl("segments")+` s ON s.partition_id = p.id
			WHERE p.queue_id = $1 AND p.name <> 'seed' GROUP BY p.id, p.name, p.last_offset`, qid)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var name string
			var last, msgs int64
			if err := rows.Scan(&name, &last, &msgs); err != nil {
				t.Fatal(err)
			}
			n++
			if msgs != 1+pushes*callers || last != msgs-1 {
				t.Errorf("partition %s: %d messages, last offset %d; want %d", name, msgs, last, 1+pushes*callers)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n != len(names) {
			t.Errorf("%d partitions, want %d", n, len(names))
		}
	})

	// Hashes in the segment rows on the layout: pushed by push_routed's
	// push_one (bundles, isolated pushes) on both workers, copied into
	// hash rows by retention (an INSERT ... SELECT on one shard) and
	// probed from both places.
	t.Run("DistributedDedupAfterRetention", func(t *testing.T) {
		c, pool, schema := openCitus(t, url, true, func(c *queen.Config) { c.Maintenance.Interval = -1 })
		tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
		q := configure(t, c, "dd", queen.QueueOptions{DedupWindow: time.Hour})
		var items []queen.Item
		for i := range 8 {
			items = append(items, queen.Item{Partition: fmt.Sprint("k", i), TransactionID: fmt.Sprint("t", i)})
		}
		push(t, q, items...)
		push(t, q, queen.Item{Partition: "k0", TransactionID: "alone"})
		if err := q.Configure(ctxT(t), queen.QueueOptions{DedupWindow: time.Hour, Retention: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctxT(t), "UPDATE "+tbl("segments")+" SET created_at = now() - interval '2 minutes'"); err != nil {
			t.Fatal(err)
		}
		if rep, err := c.Maintain(ctxT(t)); err != nil || rep.SegmentsDeleted != 9 {
			t.Fatalf("Maintain = %+v, %v; want 9 segments deleted", rep, err)
		}
		var hashRows int
		if err := pool.QueryRow(ctxT(t), "SELECT count(*) FROM "+tbl("txns")).Scan(&hashRows); err != nil || hashRows != 9 {
			t.Fatalf("hash rows after retention: %d, %v; want 9", hashRows, err)
		}
		items = append(items, queen.Item{Partition: "k0", TransactionID: "alone"})
		for _, it := range items {
			if r := push(t, q, it)[0]; r.Status != queen.Duplicate {
				t.Errorf("%s repeated after retention: %s, want duplicate", it.TransactionID, r.Status)
			}
		}
	})
	t.Run("DistributedConsume", func(t *testing.T) { testDistributedConsume(t, url) })
	t.Run("DistributedConsumerLag", func(t *testing.T) { testDistributedConsumerLag(t, url) })
	t.Run("DistributeHeldSchema", func(t *testing.T) { testDistributeHeldSchema(t, url) })
	t.Run("DistributedSchedule", func(t *testing.T) { testDistributedSchedule(t, url) })
	t.Run("DistributedMembersOfDeletedQueue", func(t *testing.T) { testMembersOfDeletedQueue(t, url) })
	t.Run("DistributedDeleteRacesPush", func(t *testing.T) { testDistributedDeleteRacesPush(t, url) })
	t.Run("DistributedFirstContactWide", func(t *testing.T) { testDistributedFirstContactWide(t, url) })
	t.Run("DistributedGroupsDrainInTurn", func(t *testing.T) { testDistributedGroupsDrainInTurn(t, url) })
	t.Run("DistributedFirstContactsAtOnce", func(t *testing.T) { testDistributedFirstContactsAtOnce(t, url) })
	t.Run("DistributedScheduleTimeoutNotStored", func(t *testing.T) { testDistributedScheduleTimeoutNotStored(t, url) })
	t.Run("DistributedOpenWithoutFlag", func(t *testing.T) { testDistributedOpenWithoutFlag(t, url) })

	t.Run("DistributedConsumeSpansWorkers", func(t *testing.T) { testConsumeSpansWorkers(t, url) })

	t.Run("Routing", func(t *testing.T) {
		_, pool, schema := openCitus(t, url, true)
		countable(t, pool)
		tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
		var qid int64
		if err := pool.QueryRow(ctxT(t), "INSERT INTO "+tbl("queues")+" (tenant, name) VALUES ($1, 'r') RETURNING id",
			queen.DefaultTenant).Scan(&qid); err != nil {
			t.Fatal(err)
		}
		// Partitions until two live on different workers.
		byNode := map[int]int64{}
		for i := 0; len(byNode) < 2 && i < 64; i++ {
			var pid int64
			var node int
			err := pool.QueryRow(ctxT(t), "INSERT INTO "+tbl("partitions")+" (id, queue_id, name) VALUES ("+tbl("partition_key")+"($1, $2, 0), $1, $2) RETURNING id",
				qid, fmt.Sprint("p", i)).Scan(&pid)
			if err == nil {
				err = pool.QueryRow(ctxT(t), `SELECT pl.groupid FROM pg_dist_placement pl
					WHERE pl.shardid = get_shard_id_for_distribution_column($1::regclass, $2::bigint)`, tbl("partitions"), pid).Scan(&node)
			}
			if err != nil {
				t.Fatal(err)
			}
			byNode[node] = pid
		}
		if len(byNode) < 2 {
			t.Fatalf("partitions on %d workers, want 2", len(byNode))
		}
		var pids []int64
		for _, pid := range byNode {
			pids = append(pids, pid)
		}
		// One partition's push and cursor, as push_one and a claim write them.
		write := func(tx pgx.Tx, pid int64) error {
			var last int64
			if err := tx.QueryRow(ctxT(t), "UPDATE "+tbl("partitions")+" SET last_offset = last_offset + 1, pending = true WHERE id = $1 RETURNING last_offset",
				pid).Scan(&last); err != nil {
				return err
			}
			if _, err := tx.Exec(ctxT(t), "INSERT INTO "+tbl("segments")+" (partition_id, base_offset, end_offset, created_at, blob) VALUES ($1, $2, $2, now(), '\\x00')",
				pid, last); err != nil {
				return err
			}
			_, err := tx.Exec(ctxT(t), "INSERT INTO "+tbl("consumers")+" (partition_id, group_name) VALUES ($1, '') ON CONFLICT (partition_id, group_name) DO UPDATE SET committed = excluded.committed",
				pid)
			return err
		}
		run := func(pids ...int64) int64 {
			before := twoPhase(t, pool)
			err := pgx.BeginFunc(ctxT(t), pool, func(tx pgx.Tx) error {
				for _, pid := range pids {
					if err := write(tx, pid); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return twoPhase(t, pool) - before
		}
		if d := run(pids[0]); d != 0 {
			t.Errorf("one partition's writes took %d two-phase commits, want 0", d)
		}
		if d := run(pids[0], pids[1]); d != 1 {
			t.Errorf("writes to partitions on two workers took %d two-phase commits, want 1", d)
		}
	})
}

// testDistributedConsume: consuming on the distributed layout (Config.Citus).
// Pops with acks, a plain Consume and a per-key Consume (KeyConcurrency)
// over partitions of one worker deliver every message once, in order per
// partition (per key for the keyed one), with no two-phase commit after
// the groups' first contacts; a consumer parked in a long poll that never
// rescans is woken by another client's push on the layout.
func testDistributedConsume(t *testing.T, url string) {
	noMaint := func(c *queen.Config) { c.Maintenance.Interval = -1 }
	c, pool, schema := openCitus(t, url, true, noMaint)
	countable(t, pool)
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	shards, err := citus.Load(ctxT(t), pool, tbl("partitions"))
	if err != nil {
		t.Fatal(err)
	}
	// Names of partitions of queue qn on one worker group, by the client's
	// reckoning of their ids: Configure creates the queue row first.
	names := func(qn string, n int) []string {
		if err := c.Queue(qn).Configure(ctxT(t), queen.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		var qid int64
		if err := pool.QueryRow(ctxT(t), "SELECT id FROM "+tbl("queues")+" WHERE name = $1", qn).Scan(&qid); err != nil {
			t.Fatal(err)
		}
		var out []string
		for i := 0; len(out) < n; i++ {
			name := fmt.Sprint("p", i)
			if sh, ok := shards.Of(citus.PartitionKey(qid, name, 0)); ok && sh.Group == shards[0].Group {
				out = append(out, name)
			}
		}
		return out
	}
	const per = 60
	pushAll := func(q *queen.Queue, parts []string, keys int) {
		var items []queen.Item
		for i := range per {
			for _, p := range parts {
				it := queen.Item{Partition: p, Data: []byte(strconv.Itoa(i))}
				if keys > 0 {
					it.Key = fmt.Sprint("k", i%keys)
				}
				items = append(items, it)
			}
		}
		for len(items) > 0 {
			n := min(len(items), 40)
			push(t, q, items[:n]...)
			items = items[n:]
		}
	}

	// Pops with acks, then a Consume, one group ("") of queue "dc".
	q := c.Queue("dc")
	parts := names("dc", 4)
	pushAll(q, parts[:1], 0)
	first := pop(t, q, queen.PopOptions{Batch: 5})
	if len(first) == 0 {
		t.Fatal("first pop: nothing")
	}
	pushAll(q, parts[1:], 0)
	before := twoPhase(t, pool)
	seen := map[string][]int{}
	var mu sync.Mutex
	got := 0
	note := func(m *queen.Message) {
		mu.Lock()
		defer mu.Unlock()
		v, _ := strconv.Atoi(string(m.Data))
		seen[m.Partition] = append(seen[m.Partition], v)
		got++
	}
	for _, m := range first {
		note(m)
		ack(t, m)
	}
	// A failed and a retried message are delivered again (not noted the
	// first time).
	if ms := pop(t, q, queen.PopOptions{Batch: 1}); len(ms) != 1 {
		t.Fatalf("pop: %d messages, want 1", len(ms))
	} else if err := ms[0].Fail(ctxT(t), errors.New("again")); err != nil {
		t.Fatal(err)
	}
	if ms := pop(t, q, queen.PopOptions{Batch: 1}); len(ms) != 1 {
		t.Fatalf("pop: %d messages, want 1", len(ms))
	} else if err := ms[0].Retry(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		ms := pop(t, q, queen.PopOptions{Batch: 7, Partitions: 2})
		var reqs []queen.AckRequest
		for _, m := range ms {
			note(m)
			if i%2 == 0 {
				ack(t, m)
			} else {
				reqs = append(reqs, queen.AckRequest{Message: m})
			}
		}
		if len(reqs) > 0 {
			errs, err := q.AckBatch(ctxT(t), reqs)
			if err == nil {
				err = errors.Join(errs...)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if d := twoPhase(t, pool) - before; d != 0 {
		t.Errorf("%d two-phase commits popping and settling one worker's partitions, want 0", d)
	}
	// A Consume is a group member: its joining, its leaving and its
	// heartbeats (at most one a second carried by its claims or renewals,
	// and one alone when those carried none lately) write the members
	// reference table, a two-phase commit each; nothing else may take one.
	memberWrites := func(start time.Time) int64 { return 2 + 2*int64(time.Since(start)/time.Second+1) }
	before = twoPhase(t, pool)
	started := time.Now()
	total := per * len(parts)
	err = consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, Wait: 100 * time.Millisecond}, Concurrency: 2},
		func(_ context.Context, m *queen.Message) error {
			note(m)
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return got >= total })
	if err != nil || got != total {
		t.Fatalf("Consume = %v after %d of %d", err, got, total)
	}
	// Idle, the member beats on its own (every 100 ms with this client's
	// timing), and Status sees it live.
	idle, cancelIdle := context.WithCancel(ctxT(t))
	consumed := make(chan error, 1)
	go func() {
		consumed <- q.Consume(idle, queen.ConsumeOptions{PopOptions: queen.PopOptions{Wait: 100 * time.Millisecond}},
			func(context.Context, *queen.Message) error { return nil })
	}()
	var live int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && live == 0; time.Sleep(50 * time.Millisecond) {
		st, err := q.Status(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		live = len(st.Members[""])
	}
	time.Sleep(time.Second)
	cancelIdle()
	if err := <-consumed; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("idle Consume = %v", err)
	}
	if live != 1 {
		t.Fatalf("live members of the idle Consume: %d, want 1", live)
	}
	for _, p := range parts {
		for i, v := range seen[p] {
			if v != i {
				t.Fatalf("partition %s: handled %v, want each of 0..%d once in order", p, seen[p], per-1)
			}
		}
		if len(seen[p]) != per {
			t.Fatalf("partition %s: %d handled, want %d", p, len(seen[p]), per)
		}
	}
	if d, most := twoPhase(t, pool)-before, memberWrites(started); d > most {
		t.Errorf("%d two-phase commits consuming one worker's partitions, want at most %d (member heartbeats)", d, most)
	} else {
		t.Logf("Consume: %d two-phase commits (member heartbeats: at most %d)", d, most)
	}

	// A per-key Consume of queue "dk": one handler at a time per key, in
	// order per key.
	k := c.Queue("dk")
	kparts := names("dk", 2)
	pushAll(k, kparts, 4)
	if ms := pop(t, k, queen.PopOptions{Partition: kparts[0], Batch: 1}); len(ms) != 1 {
		t.Fatalf("first keyed pop: %d messages", len(ms))
	} else if err := ms[0].Fail(ctxT(t), errors.New("again")); err != nil {
		t.Fatal(err)
	}
	before = twoPhase(t, pool)
	started = time.Now()
	keyNext := map[string]int{}
	got = 0
	total = per * len(kparts)
	err = consumeUntil(t, k, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, Wait: 100 * time.Millisecond}, Concurrency: 2, KeyConcurrency: 4},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			kk := m.Partition + "/" + m.Key
			if want := strconv.Itoa(keyNext[kk]*4 + int(m.Key[1]-'0')); string(m.Data) != want {
				t.Errorf("%s: %s handled, want %s", kk, m.Data, want)
			}
			keyNext[kk]++
			got++
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return got >= total })
	if err != nil || got != total {
		t.Fatalf("keyed Consume = %v after %d of %d", err, got, total)
	}
	if d, most := twoPhase(t, pool)-before, memberWrites(started); d > most {
		t.Errorf("%d two-phase commits in a per-key Consume of one worker's partitions, want at most %d (member heartbeats)", d, most)
	} else {
		t.Logf("per-key Consume: %d two-phase commits (member heartbeats: at most %d)", d, most)
	}

	// A consumer of another client, parked in a long poll that never
	// rescans, woken by a push on the layout.
	waiter, _, _ := openCitus(t, url, true, noMaint, queen.PopRescan(time.Hour), func(cfg *queen.Config) { cfg.Schema = schema })
	wq := waiter.Queue("dc")
	_ = pop(t, wq, queen.PopOptions{}) // first contact done before; nothing left
	woke := make(chan []*queen.Message, 1)
	go func() {
		ms, err := wq.Pop(ctxT(t), queen.PopOptions{Wait: time.Minute})
		if err != nil {
			t.Error(err)
		}
		woke <- ms
	}()
	time.Sleep(500 * time.Millisecond)
	pushed := time.Now()
	push(t, q, queen.Item{Partition: parts[2], Data: []byte("wake")})
	select {
	case ms := <-woke:
		if len(ms) != 1 || string(ms[0].Data) != "wake" {
			t.Fatalf("woken pop: %q, want [wake]", datas(ms))
		}
		t.Logf("woken %v after the push", time.Since(pushed))
	case <-time.After(20 * time.Second):
		t.Fatal("a push on the layout did not wake a parked consumer of another client")
	}
}

// testConsumeSpansWorkers consumes partitions spread over both workers with
// claims of several partitions (Pop with Partitions > 1, Consume with
// Concurrency > 1) and settles of several leases (AckBatch, fused acks):
// after the group's first contact, claims are routed by worker and settles
// split by worker, so none takes a two-phase commit but a Consume's member
// writes.
func testConsumeSpansWorkers(t *testing.T, url string) {
	c, pool, schema := openCitus(t, url, true, func(c *queen.Config) { c.Maintenance.Interval = -1 },
		queen.MemberTiming(100*time.Millisecond, 2*time.Second))
	countable(t, pool)
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	shards, err := citus.Load(ctxT(t), pool, tbl("partitions"))
	if err != nil {
		t.Fatal(err)
	}
	q := c.Queue("cs")
	if err := q.Configure(ctxT(t), queen.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	var qid int64
	if err := pool.QueryRow(ctxT(t), "SELECT id FROM "+tbl("queues")+" WHERE name = 'cs'").Scan(&qid); err != nil {
		t.Fatal(err)
	}
	const perWorker, per = 12, 60
	byGroup := map[int32][]string{}
	lo, hi := shards[0].Group, shards[len(shards)-1].Group
	if lo == hi {
		t.Skip("one worker group: nothing spans workers")
	}
	for i := 0; len(byGroup[lo]) < perWorker || len(byGroup[hi]) < perWorker; i++ {
		name := fmt.Sprint("p", i)
		sh, _ := shards.Of(citus.PartitionKey(qid, name, 0))
		byGroup[sh.Group] = append(byGroup[sh.Group], name)
	}
	parts := append(append([]string{}, byGroup[lo][:perWorker]...), byGroup[hi][:perWorker]...)
	var items []queen.Item
	for i := range per {
		for _, p := range parts {
			items = append(items, queen.Item{Partition: p, Data: []byte(strconv.Itoa(i))})
		}
	}
	push(t, q, items...)

	var mu sync.Mutex
	seen := map[string][]int{}
	got := 0
	note := func(m *queen.Message) {
		mu.Lock()
		defer mu.Unlock()
		v, _ := strconv.Atoi(string(m.Data))
		seen[m.Partition] = append(seen[m.Partition], v)
		got++
	}
	// The group's first contact (its subscription, its cursors) writes
	// reference tables and every worker's cursors: a 2PC, not counted.
	for _, m := range pop(t, q, queen.PopOptions{Batch: 1}) {
		note(m)
		ack(t, m)
	}
	// Settles over both workers: an AckBatch of one lease on each, and
	// acks of leases on both at once (fused), a failure among them.
	before := twoPhase(t, pool)
	for range 3 {
		var reqs []queen.AckRequest
		for _, p := range []string{byGroup[lo][0], byGroup[hi][0]} {
			for _, m := range pop(t, q, queen.PopOptions{Partition: p, Batch: 2}) {
				note(m)
				reqs = append(reqs, queen.AckRequest{Message: m})
			}
		}
		errs, err := q.AckBatch(ctxT(t), reqs)
		if err == nil {
			err = errors.Join(errs...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i, p := range append(append([]string{}, byGroup[lo][1:5]...), byGroup[hi][1:5]...) {
		wg.Go(func() {
			for j := range 3 {
				ms, err := q.Pop(ctxT(t), queen.PopOptions{Partition: p, Batch: 1})
				if err != nil || len(ms) != 1 {
					t.Errorf("pop %s: %d messages, %v", p, len(ms), err)
					return
				}
				if i == 0 && j == 2 {
					err = ms[0].Fail(ctxT(t), errors.New("again")) // delivered again
				} else {
					note(ms[0])
					err = ms[0].Ack(ctxT(t))
				}
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	d := twoPhase(t, pool) - before
	t.Logf("settles over both workers: %d two-phase commits", d)
	if d != 0 {
		t.Errorf("settles of leases on both workers: %d two-phase commits, want 0", d)
	}

	// Claims of several partitions each.
	before = twoPhase(t, pool)
	claims := 0
	spanned := 0
	for range 4 {
		ms := pop(t, q, queen.PopOptions{Batch: 120, Partitions: 6})
		if len(ms) == 0 {
			break
		}
		claims++
		groups := map[int32]bool{}
		reqs := make([]queen.AckRequest, 0, len(ms))
		for _, m := range ms {
			sh, _ := shards.Of(citus.PartitionKey(qid, m.Partition, 0))
			groups[sh.Group] = true
			note(m)
			reqs = append(reqs, queen.AckRequest{Message: m})
		}
		if len(groups) > 1 {
			spanned++
		}
		errs, err := q.AckBatch(ctxT(t), reqs)
		if err == nil {
			err = errors.Join(errs...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	d = twoPhase(t, pool) - before
	t.Logf("Pop (Partitions 6) and AckBatch: %d two-phase commits in %d claims, %d of which spanned workers", d, claims, spanned)
	if d != 0 || spanned != 0 {
		t.Errorf("pops of several partitions over two workers: %d two-phase commits and %d claims spanning workers, want 0 and 0", d, spanned)
	}

	// A Consume with Concurrency > 1 drains the rest: its claims are fused
	// across its handlers, its acks too; its member writes (joining,
	// heartbeats on its claims and, idle, of their own, leaving) go to the
	// coordinator only. None of it may take a two-phase commit.
	before = twoPhase(t, pool)
	started := time.Now()
	total := per * len(parts)
	consumedBefore := got
	err = consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 8, Partitions: 3, Wait: 100 * time.Millisecond}, Concurrency: 8},
		func(_ context.Context, m *queen.Message) error {
			note(m)
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return got >= total })
	if err != nil || got != total {
		t.Fatalf("Consume = %v after %d of %d", err, got, total)
	}
	for _, p := range parts {
		if len(seen[p]) != per {
			t.Fatalf("partition %s: %d handled, want %d", p, len(seen[p]), per)
		}
		for i, v := range seen[p] {
			if v != i {
				t.Fatalf("partition %s: handled %v, want each of 0..%d once in order", p, seen[p], per-1)
			}
		}
	}
	d = twoPhase(t, pool) - before
	t.Logf("Consume (Concurrency 8) of %d messages, then one idle, in %v: %d two-phase commits", total-consumedBefore,
		time.Since(started).Round(time.Millisecond), d)
	if d != 0 {
		t.Errorf("%d two-phase commits consuming both workers' partitions (members joining, beating and leaving), want 0", d)
	}
}

// testDistributedDeleteRacesPush: Queue.Delete and a push creating a
// partition of the queue, each in a transaction the other meets, on the
// layout. A queue row's lock on the coordinator does not reach a worker,
// where the new partition's foreign key check takes its key-share lock:
// the delete must still wait for the push (and delete the segment it
// wrote, never leave it behind its partition's cascaded delete), and the
// push that meets a delete must fail as a push racing Queue.Delete does
// (QN001), never with the foreign key's error.
func testDistributedDeleteRacesPush(t *testing.T, url string) {
	noMaint := func(c *queen.Config) { c.Maintenance.Interval = -1 }
	c, pool, schema := openCitus(t, url, true, noMaint)
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	orphans := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctxT(t), `SELECT count(*) FROM `+tbl("segments")+` s
			WHERE NOT EXISTS (SELECT 1 FROM `+tbl("partitions")+` p WHERE p.id = s.partition_id)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	q := c.Queue("dq")

	// The push first: its transaction creates a partition and holds it
	// while the delete starts.
	push(t, q, queen.Item{Partition: "old", Data: []byte("o")})
	tx, err := pool.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := q.PushTx(ctxT(t), tx, []queen.Item{{Partition: "new", Data: []byte("n")}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- q.Delete(ctxT(t)) }()
	select {
	case err := <-done:
		t.Fatalf("Delete ended (%v) while a push of the queue was open", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := tx.Commit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if n := orphans(); n != 0 {
		t.Errorf("push first: %d segments left of partitions the delete removed", n)
	}

	// The delete first, held open: a push creating a partition of the
	// queue waits for it, then fails as racing Queue.Delete.
	push(t, q, queen.Item{Partition: "old", Data: []byte("o")})
	del, err := pool.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer del.Rollback(context.Background())
	var existed bool
	if err := del.QueryRow(ctxT(t), "SELECT "+pgx.Identifier{schema}.Sanitize()+".delete_queue($1::uuid, 'dq')",
		"00000000-0000-0000-0000-000000000000").Scan(&existed); err != nil || !existed {
		t.Fatalf("delete_queue: %v, %v", existed, err)
	}
	perr := make(chan error, 1)
	go func() {
		ptx, err := pool.Begin(ctxT(t))
		if err != nil {
			perr <- err
			return
		}
		defer ptx.Rollback(context.Background())
		_, err = q.PushTx(ctxT(t), ptx, []queen.Item{{Partition: "new2", Data: []byte("n")}})
		if err == nil {
			err = ptx.Commit(ctxT(t))
		}
		perr <- err
	}()
	time.Sleep(500 * time.Millisecond)
	if err := del.Commit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	err = <-perr
	var pgErr *pgconn.PgError
	if err != nil && (!errors.As(err, &pgErr) || pgErr.Code != "QN001") {
		t.Errorf("push after the delete: %v, want success or QN001", err)
	}
	if n := orphans(); n != 0 {
		t.Errorf("delete first: %d segments left of partitions gone", n)
	}
}

// testDistributedFirstContactWide: a SubscribeFrom group's first Pop on a
// queue of 400 partitions another group has read (none pending, so each
// needs a backlog row) ends within a 2 s statement timeout. The first
// contact is one transaction: one that outlives the timeout rolls back,
// and every later pop starts it over, so the group never reads.
func testDistributedFirstContactWide(t *testing.T, url string) {
	const parts = 400
	noMaint := func(c *queen.Config) { c.Maintenance.Interval = -1 }
	c, _, schema := openCitus(t, url, true, noMaint)
	q := c.Queue("wide")
	from := time.Now().Add(-time.Hour)
	items := make([]queen.Item, parts)
	for i := range items {
		items[i] = queen.Item{Partition: fmt.Sprintf("p%03d", i), Data: []byte("x")}
	}
	push(t, q, items...)
	// Group "a" reads everything: the ready set empties.
	for n := 0; n < parts; {
		msgs, err := q.Pop(ctxT(t), queen.PopOptions{Group: "a", Batch: parts, Partitions: 64})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			t.Fatalf("group a read %d of %d", n, parts)
		}
		for _, m := range msgs {
			if err := m.Ack(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		}
		n += len(msgs)
	}
	short, err := queen.Open(ctxT(t), queen.Config{DatabaseURL: url, Schema: schema, Citus: true,
		StatementTimeout: 2 * time.Second, Logger: pgtest.Logger(t), SpoolDir: t.TempDir(),
		Maintenance: queen.MaintenanceConfig{Interval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close(context.Background())
	start := time.Now()
	msgs, err := short.Queue("wide").Pop(ctxT(t), queen.PopOptions{Group: "b", Batch: 10, Partitions: 10,
		Subscription: queen.SubscribeFrom(from)})
	if err != nil {
		t.Fatalf("first Pop of a SubscribeFrom group over %d partitions: %v (after %v)", parts, err, time.Since(start))
	}
	if len(msgs) == 0 {
		t.Fatalf("first Pop of a SubscribeFrom group over %d partitions: nothing", parts)
	}
	t.Logf("first contact over %d partitions: %v", parts, time.Since(start))
}

// testMembersOfDeletedQueue: on the layout members is a plain table of the
// coordinator without the foreign key whose cascade deletes a queue's
// members on PostgreSQL; Queue.Delete must delete them all the same.
func testMembersOfDeletedQueue(t *testing.T, url string) {
	c, pool, schema := openCitus(t, url, true, func(c *queen.Config) { c.Maintenance.Interval = -1 })
	q := c.Queue("md")
	pushN(t, q, "p", "m", 1)
	if _, err := q.Pop(ctxT(t), queen.PopOptions{Member: "named"}); err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(ctxT(t), "SELECT count(*) FROM "+pgx.Identifier{schema, "members"}.Sanitize()+
			" WHERE member_id = 'named'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("member rows of the named Pop: %d, want 1", n)
	}
	if err := q.Delete(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Errorf("member rows after Queue.Delete: %d, want 0", n)
	}
}

// testDistributedGroupsDrainInTurn: TestEmptyPopMeansDrained on the
// layout, where partitions every group has read leave the ready set a few
// a pop: an empty pop must still mean the group has nothing left.
func testDistributedGroupsDrainInTurn(t *testing.T, url string) {
	c, _, _ := openCitus(t, url, true, func(c *queen.Config) { c.Maintenance.Interval = -1 })
	drainEachInTurn(t, c.Queue("turns"), 1500)
}

// testDistributedFirstContactsAtOnce: on the layout a first contact writes
// reference tables (the group's subscription), whose shards Citus locks on
// every node, so several groups' first pops at once can meet as a
// deadlock (40P01). Each such claim rolled back whole: Pop runs it again
// rather than fail the caller.
func testDistributedFirstContactsAtOnce(t *testing.T, url string) {
	c, pool, _ := openCitus(t, url, true, func(c *queen.Config) { c.Maintenance.Interval = -1 })
	// Deadlocks anywhere on the cluster: a pop runs an aborted claim again,
	// so its errors alone would not show them; the scheduled mover, idle
	// here, only logs its own.
	deadlocks := func() (n int64) {
		t.Helper()
		time.Sleep(1500 * time.Millisecond) // backends flush their counts within a second
		if err := pool.QueryRow(ctxT(t), `SELECT (SELECT deadlocks FROM pg_stat_database WHERE datname = current_database())
			+ (SELECT coalesce(sum(result::bigint), 0) FROM run_command_on_workers(
			     format('SELECT deadlocks FROM pg_stat_database WHERE datname = %L', current_database())))`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := deadlocks()
	q := c.Queue("contacts")
	items := make([]queen.Item, 64)
	for i := range items {
		items[i] = queen.Item{Partition: fmt.Sprintf("p%02d", i), Data: []byte("x")}
	}
	push(t, q, items...)
	const rounds, groups = 6, 8
	var failed atomic.Int64
	for r := range rounds {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range groups {
			wg.Go(func() {
				<-start
				msgs, err := q.Pop(ctxT(t), queen.PopOptions{Group: fmt.Sprintf("r%d-g%d", r, g), Batch: 1, Partitions: 4})
				if err != nil {
					failed.Add(1)
					t.Errorf("round %d, group %d: first Pop: %v", r, g, err)
					return
				}
				if len(msgs) == 0 {
					t.Errorf("round %d, group %d: first Pop found nothing of 64 partitions", r, g)
				}
			})
		}
		close(start)
		wg.Wait()
	}
	t.Logf("%d of %d first pops failed", failed.Load(), rounds*groups)
	if n := deadlocks() - before; n != 0 {
		t.Errorf("%d deadlocks on the cluster during %d first contacts", n, rounds*groups)
	}
}

// testDistributedScheduleTimeoutNotStored: a scheduled item reported
// Failed after its statement outlived StatementTimeout (here waiting on
// the schedule's state row) must not be stored once what it waited on
// lets go: Failed means not stored.
func testDistributedScheduleTimeoutNotStored(t *testing.T, url string) {
	c, pool, schema := openCitus(t, url, true, func(c *queen.Config) {
		c.Maintenance.Interval = -1
		c.StatementTimeout = 700 * time.Millisecond
	})
	q := c.Queue("schedwait")
	push(t, q, queen.Item{Data: []byte("before")})
	tx, err := pool.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctxT(t), "SELECT 1 FROM "+pgx.Identifier{schema, "scheduled_state"}.Sanitize()+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	var txns []string
	for _, ahead := range []time.Duration{10 * time.Minute, 2 * time.Hour} {
		txn := "later-" + ahead.String()
		txns = append(txns, txn)
		res, err := q.Push(ctxT(t), []queen.Item{{Data: []byte("later"), DeliverAt: time.Now().Add(ahead), TransactionID: txn}})
		if err != nil {
			t.Fatalf("%s ahead: %v", ahead, err)
		}
		if res[0].Status != queen.Failed {
			t.Fatalf("%s ahead: %+v, want Failed while the state row is held", ahead, res[0])
		}
	}
	if err := tx.Rollback(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if n, err := q.CancelScheduled(ctxT(t), txns); err != nil || n != 0 {
		t.Fatalf("items reported Failed: %d of %d found scheduled once the lock was released (%v)", n, len(txns), err)
	}
}
