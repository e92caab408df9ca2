package queen_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/zeebo/xxh3"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// manual disables the background loop so tests drive passes themselves.
func manual(c *queen.Config) { c.Maintenance.Interval = -1 }

func maintain(t testing.TB, c *queen.Client) queen.MaintenanceReport {
	t.Helper()
	rep, err := c.Maintain(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Ran {
		t.Fatal("maintenance pass did not run")
	}
	return rep
}

func partitionRow(t testing.TB, c *queen.Client, name string) (logStart, txnsStart, last int64) {
	t.Helper()
	err := c.Pool().QueryRow(ctxT(t), "SELECT log_start, txns_start, last_offset FROM "+
		pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+" WHERE name = $1", name).Scan(&logStart, &txnsStart, &last)
	if err != nil {
		t.Fatal(err)
	}
	return
}

func TestRetentionDeletesWholeSegmentsFromTheHead(t *testing.T) {
	inWindow(t, 300*time.Millisecond, func(_ string, window time.Duration) bool {
		c := open(t, manual)
		q := c.Queue("q")
		if err := q.Configure(ctxT(t), queen.QueueOptions{Retention: window}); err != nil {
			t.Fatal(err)
		}
		start := time.Now() // no later than the first segment's created_at
		for range 3 {
			push(t, q, queen.Item{}, queen.Item{})
		}
		rep := maintain(t, c)
		if time.Since(start) >= window {
			return false
		}
		if rep.SegmentsDeleted != 0 {
			t.Fatalf("deleted %d young segments", rep.SegmentsDeleted)
		}
		time.Sleep(window + 100*time.Millisecond)
		start = time.Now()
		push(t, q, queen.Item{}) // young: must survive
		rep = maintain(t, c)
		if time.Since(start) >= window {
			return false
		}
		if rep.SegmentsDeleted != 3 {
			t.Fatalf("deleted %d segments, want the 3 old ones", rep.SegmentsDeleted)
		}
		if ls, _, _ := partitionRow(t, c, "Default"); ls != 6 {
			t.Fatalf("log_start %d, want 6", ls)
		}
		if n := countRows(t, c, "segments"); n != 1 {
			t.Fatalf("%d segments left, want 1", n)
		}
		if r := push(t, q, queen.Item{})[0]; r.Offset != 7 {
			t.Fatalf("offset after retention %d, want 7", r.Offset)
		}
		return true
	})
}

// Completed retention is pinned by the slowest group's cursor.
func TestCompletedRetentionWaitsForTheSlowestGroup(t *testing.T) {
	c := open(t, manual)
	q := c.Queue("q")
	if err := q.Configure(ctxT(t), queen.QueueOptions{CompletedRetention: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		push(t, q, queen.Item{})
	}
	time.Sleep(10 * time.Millisecond)
	if rep := maintain(t, c); rep.SegmentsDeleted != 0 {
		t.Fatalf("deleted %d segments no group consumed", rep.SegmentsDeleted)
	}
	// Two groups: one through offset 2, one through offset 0.
	_, err := c.Pool().Exec(ctxT(t), "INSERT INTO "+pgx.Identifier{c.Schema(), "consumers"}.Sanitize()+
		" (partition_id, group_name, committed) SELECT id, g, o FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
		", (VALUES ('fast', 2), ('slow', 0)) v(g, o)")
	if err != nil {
		t.Fatal(err)
	}
	if rep := maintain(t, c); rep.SegmentsDeleted != 1 {
		t.Fatalf("deleted %d segments, want only offset 0", rep.SegmentsDeleted)
	}
	if ls, _, _ := partitionRow(t, c, "Default"); ls != 1 {
		t.Fatalf("log_start %d, want 1", ls)
	}
}

// Hash rows (the hashes retention kept of the segments it deleted) are
// purged once older than max(dedup window, lease time, floor), and the
// purge moves txns_start past them.
func TestHashRowsPurgedAfterWindowAndFloor(t *testing.T) {
	c := open(t, manual, func(c *queen.Config) { c.Maintenance.HashFloor = time.Millisecond })
	q := configure(t, c, "q", queen.QueueOptions{DedupWindow: time.Hour, LeaseTime: time.Millisecond, Retention: time.Minute})
	push(t, q, queen.Item{TransactionID: "a"})
	push(t, q, queen.Item{TransactionID: "b"})
	ageSegmentsBy(t, c, 2*time.Minute)
	rep := maintain(t, c)
	if rep.SegmentsDeleted != 2 || rep.HashRowsDeleted != 0 {
		t.Fatalf("deleted %d segments and %d hash rows, want 2 and none inside the window", rep.SegmentsDeleted, rep.HashRowsDeleted)
	}
	if n := countRows(t, c, "txns"); n != 2 {
		t.Fatalf("%d hash rows kept by retention, want 2", n)
	}
	// An hour later (the hash rows' clock moved back past the window).
	ageColumn(t, c, "txns", "created_at", time.Hour)
	push(t, q, queen.Item{TransactionID: "c"})
	if rep := maintain(t, c); rep.HashRowsDeleted != 2 {
		t.Fatalf("purged %d hash rows, want 2", rep.HashRowsDeleted)
	}
	if _, ts, _ := partitionRow(t, c, "Default"); ts != 2 {
		t.Fatalf("txns_start %d, want 2", ts)
	}
	if r := push(t, q, queen.Item{TransactionID: "c"})[0]; r.Status != queen.Duplicate {
		t.Fatalf("c inside its window: %s", r.Status)
	}
	if r := push(t, q, queen.Item{TransactionID: "a"})[0]; r.Status != queen.Queued {
		t.Fatalf("a past its window: %s", r.Status)
	}
}

func TestIdleEmptyPartitionIsForgotten(t *testing.T) {
	c := open(t, manual, func(c *queen.Config) { c.Maintenance.IdlePartition = time.Hour })
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "idle"}, queen.Item{Partition: "busy"})
	ctx := ctxT(t)
	// "idle" was emptied (as retention would) and both look 90 minutes
	// unwritten; "busy" still holds a message.
	_, err := c.Pool().Exec(ctx, "DELETE FROM "+pgx.Identifier{c.Schema(), "segments"}.Sanitize()+
		" WHERE partition_id = (SELECT id FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+" WHERE name = 'idle')")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pool().Exec(ctx, "UPDATE "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
		" SET last_write_at = now() - interval '90 minutes'"); err != nil {
		t.Fatal(err)
	}
	if rep := maintain(t, c); rep.PartitionsPurged != 1 {
		t.Fatalf("purged %d partitions, want 1 (idle)", rep.PartitionsPurged)
	}
	if n := countRows(t, c, "partitions"); n != 1 {
		t.Fatalf("%d partitions left, want busy only", n)
	}
	if r := push(t, q, queen.Item{Partition: "idle"})[0]; r.Status != queen.Queued || r.Offset != 0 {
		t.Fatalf("push to a forgotten partition: %+v", r)
	}
	if r := push(t, q, queen.Item{Partition: "busy"})[0]; r.Offset != 1 {
		t.Fatalf("busy kept its offsets? %+v", r)
	}
}

func TestMaintenanceRunsInOneProcessAtATime(t *testing.T) {
	c := open(t, manual)
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	key := int64(xxh3.HashString("queen:maintenance:" + c.Schema()))
	// Another process holds the maintenance lock: this one skips its pass.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		t.Fatal(err)
	}
	if rep, err := c.Maintain(ctx); err != nil || rep.Ran {
		t.Fatalf("pass while another process maintains: %+v %v", rep, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
		t.Fatal(err)
	}
	maintain(t, c)
}

func TestConsumerLagView(t *testing.T) {
	c := open(t, manual)
	q := c.Queue("q")
	push(t, q, queen.Item{}, queen.Item{}, queen.Item{})
	_, err := c.Pool().Exec(ctxT(t), "INSERT INTO "+pgx.Identifier{c.Schema(), "consumers"}.Sanitize()+
		" (partition_id, group_name, committed) SELECT id, 'reports', 0 FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	var lag int64
	var secs float64
	err = c.Pool().QueryRow(ctxT(t), "SELECT lag_messages, lag_seconds FROM "+
		pgx.Identifier{c.Schema(), "consumer_lag"}.Sanitize()+" WHERE group_name = 'reports'").Scan(&lag, &secs)
	if err != nil {
		t.Fatal(err)
	}
	if lag != 2 || secs < 0 {
		t.Fatalf("lag %d messages, %f s; want 2 messages", lag, secs)
	}
}

// ageSegments moves every stored segment an hour into the past, so
// retention finds it due without the test sleeping.
func ageSegments(t testing.TB, c *queen.Client) {
	t.Helper()
	if onLayout() {
		ageSegmentRows(t, c, time.Hour)
		return
	}
	if _, err := c.Pool().Exec(ctxT(t), "UPDATE "+pgx.Identifier{c.Schema(), "segments"}.Sanitize()+
		" SET created_at = created_at - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
}

// ageSegmentRows moves every segment's created_at back by d, on the
// layout (see ageColumn).
func ageSegmentRows(t testing.TB, c *queen.Client, d time.Duration) {
	t.Helper()
	ageColumn(t, c, "segments", "created_at", d)
}

// ageColumn moves the timestamptz column col of every row of table back
// by d. On the layout one value at a time, the new time a parameter:
// Citus rejects the arithmetic on a column in an UPDATE (a STABLE
// operator over a column reference).
func ageColumn(t testing.TB, c *queen.Client, table, col string, d time.Duration) {
	t.Helper()
	ctx := ctxT(t)
	tb, cl := pgx.Identifier{c.Schema(), table}.Sanitize(), pgx.Identifier{col}.Sanitize()
	if !onLayout() {
		if _, err := c.Pool().Exec(ctx, "UPDATE "+tb+" SET "+cl+" = "+cl+" - $1::bigint * interval '1 microsecond'",
			d.Microseconds()); err != nil {
			t.Fatal(err)
		}
		return
	}
	rows, err := c.Pool().Query(ctx, "SELECT DISTINCT "+cl+" FROM "+tb+" WHERE "+cl+" IS NOT NULL")
	if err != nil {
		t.Fatal(err)
	}
	ats, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		t.Fatal(err)
	}
	// Oldest first, so a value moved back never meets one not moved yet.
	slices.SortFunc(ats, func(a, b time.Time) int { return a.Compare(b) })
	for _, at := range ats {
		if _, err := c.Pool().Exec(ctx, "UPDATE "+tb+" SET "+cl+" = $1 WHERE "+cl+" = $2", at.Add(-d), at); err != nil {
			t.Fatal(err)
		}
	}
}

// Every group subscribed to the queue pins completed retention on every
// partition, also on a partition created after its first contact that it
// has not popped from yet (it has no cursor row there). Queue mode ("") is
// such a group too.
func TestCompletedRetentionKeepsWhatASubscribedGroupHasNotRead(t *testing.T) {
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{CompletedRetention: time.Millisecond})
	pushN(t, q, "old", "o", 1)
	for _, g := range []string{"", "g1", "g2"} {
		msgs := pop(t, q, queen.PopOptions{Group: g, Partition: "old"})
		wantData(t, msgs, "o0")
		ack(t, msgs[0])
	}
	pushN(t, q, "new", "n", 2)
	msgs := pop(t, q, queen.PopOptions{Group: "g1", Partition: "new", Batch: 10})
	wantData(t, msgs, "n0", "n1")
	ack(t, msgs[1])
	ageSegments(t, c)
	// "old" was read by all three groups; "new" by g1 only.
	if rep := maintain(t, c); rep.SegmentsDeleted != 1 {
		t.Fatalf("deleted %d segments, want 1 (old's)", rep.SegmentsDeleted)
	}
	for _, g := range []string{"", "g2"} {
		wantData(t, pop(t, q, queen.PopOptions{Group: g, Partition: "new", Batch: 10}), "n0", "n1")
	}
}

// A group without a cursor row on a partition older than its subscription
// (one created concurrently with its first contact) needs only what its
// subscription would deliver: with SubscribeNew the messages pushed after
// its first contact, with SubscribeFrom(t) those pushed at or after t.
// Completed retention may delete the older ones and keeps the rest, and the
// group's late seeding reads exactly the rest.
func TestCompletedRetentionUnseededGroupNeedsOnlyItsSubscription(t *testing.T) {
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{CompletedRetention: time.Millisecond})
	pushN(t, q, "p", "a", 1)
	time.Sleep(5 * time.Millisecond) // distinct timestamps: a0 < from < first contacts
	from := time.Now()
	time.Sleep(5 * time.Millisecond)
	wantData(t, pop(t, q, queen.PopOptions{Group: "new", Partition: "p", Subscription: queen.SubscribeNew}))
	wantData(t, pop(t, q, queen.PopOptions{Group: "from", Partition: "p", Subscription: queen.SubscribeFrom(from)}))
	time.Sleep(5 * time.Millisecond)
	pushN(t, q, "p", "b", 1)
	msgs := pop(t, q, queen.PopOptions{Group: "all", Partition: "p", Batch: 10})
	wantData(t, msgs, "a0", "b0")
	ack(t, msgs[1])
	// The state a first contact racing with p's creation leaves: no row.
	if _, err := c.Pool().Exec(ctxT(t), "DELETE FROM "+pgx.Identifier{c.Schema(), "consumers"}.Sanitize()+
		" WHERE group_name IN ('new', 'from')"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // past CompletedRetention
	if rep := maintain(t, c); rep.SegmentsDeleted != 1 {
		t.Fatalf("deleted %d segments, want 1 (a0, older than both subscriptions)", rep.SegmentsDeleted)
	}
	for _, g := range []string{"new", "from"} {
		wantData(t, pop(t, q, queen.PopOptions{Group: g, Partition: "p", Batch: 10}), "b0")
	}
}

// The idle-partition purge forgets a partition's hash rows with it, so it
// must wait until none is inside the queue's DedupWindow: a producer retry
// after the purge would be stored again.
func TestIdlePurgeKeepsHashesInsideTheDedupWindow(t *testing.T) {
	c := open(t, manual, func(c *queen.Config) { c.Maintenance.IdlePartition = 500 * time.Millisecond })
	q := configure(t, c, "q", queen.QueueOptions{DedupWindow: time.Hour, Retention: time.Millisecond})
	push(t, q, queen.Item{Partition: "k", TransactionID: "t1"})
	waitFor(t, 10*time.Second, "retention to empty k", func() bool { return maintain(t, c).SegmentsDeleted == 1 })
	// k is now empty and looks long unwritten; t1 is minutes inside its window.
	s := pgx.Identifier{c.Schema()}.Sanitize()
	if _, err := c.Pool().Exec(ctxT(t), "UPDATE "+s+".partitions SET last_write_at = now() - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	if rep := maintain(t, c); rep.PartitionsPurged != 0 {
		t.Fatalf("purged %d partitions holding hash rows inside the dedup window", rep.PartitionsPurged)
	}
	if r := push(t, q, queen.Item{Partition: "k", TransactionID: "t1"})[0]; r.Status != queen.Duplicate {
		t.Fatalf("retry of t1 inside its window: %s, want duplicate", r.Status)
	}
	// Once the window has passed the partition is forgotten.
	ageColumn(t, c, "txns", "created_at", 2*time.Hour)
	if _, err := c.Pool().Exec(ctxT(t), "UPDATE "+s+".partitions SET last_write_at = now() - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	if rep := maintain(t, c); rep.PartitionsPurged != 1 {
		t.Fatalf("purged %d partitions, want k once its window passed", rep.PartitionsPurged)
	}
	if r := push(t, q, queen.Item{Partition: "k", TransactionID: "t1"})[0]; r.Status != queen.Queued || r.Offset != 0 {
		t.Fatalf("push to the forgotten k: %+v", r)
	}
}

// Status and the consumer_lag view count lag the same way, also after
// Retention deleted messages a group had not read: those are gone, so
// they are not lag.
func TestStatusLagMatchesViewAfterRetention(t *testing.T) {
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{Retention: time.Hour})
	for range 4 {
		push(t, q, queen.Item{})
	}
	ack(t, pop(t, q, queen.PopOptions{Group: "g", Batch: 1})[0]) // committed 0
	ageSegments(t, c)
	push(t, q, queen.Item{}, queen.Item{}) // young: offsets 4 and 5 stay
	if rep := maintain(t, c); rep.SegmentsDeleted != 4 {
		t.Fatalf("deleted %d segments, want the 4 old ones", rep.SegmentsDeleted)
	}
	var viewLag int64
	var viewSecs float64
	if err := c.Pool().QueryRow(ctxT(t), "SELECT lag_messages, lag_seconds FROM "+
		pgx.Identifier{c.Schema(), "consumer_lag"}.Sanitize()+" WHERE group_name = 'g'").Scan(&viewLag, &viewSecs); err != nil {
		t.Fatal(err)
	}
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	var g *queen.GroupStatus
	for i, gs := range st.Partitions[0].Groups {
		if gs.Group == "g" {
			g = &st.Partitions[0].Groups[i]
		}
	}
	if g == nil {
		t.Fatalf("no group g in %+v", st.Partitions)
	}
	if viewLag != 2 || g.Lag != viewLag {
		t.Fatalf("Status lag %d, consumer_lag %d; want both 2 (offsets 4 and 5)", g.Lag, viewLag)
	}
	// Both age the head from the same segment (the young one), not the
	// deleted ones an hour old.
	if g.LagAge <= 0 || g.LagAge > time.Minute || viewSecs <= 0 || viewSecs > 60 {
		t.Fatalf("Status lag age %v, consumer_lag %f s; want both that of the young segment", g.LagAge, viewSecs)
	}
	// Queues counts as Status does.
	qs, err := c.Queues(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, qi := range qs {
		for _, qg := range qi.Groups {
			if qg.Group == "g" && (qg.Lag != 2 || qg.LagAge > time.Minute) {
				t.Fatalf("Queues: group g lag %d, age %v; want 2 and that of the young segment", qg.Lag, qg.LagAge)
			}
		}
	}
}
