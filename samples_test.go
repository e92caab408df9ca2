package queen_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// sampleRows counts the ring's rows of queue name.
func sampleRows(t testing.TB, c *queen.Client, name string) int {
	t.Helper()
	s := pgx.Identifier{c.Schema()}.Sanitize()
	var n int
	if err := c.Pool().QueryRow(ctxT(t), "SELECT count(*) FROM "+s+".samples x JOIN "+s+
		".queues q ON q.id = x.queue_id WHERE q.name = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Maintenance passes fill the ring: one sample per interval with the
// queue's running totals and each group's consumed count and lag, oldest
// first, never more than SamplesKept rows per queue however long it runs.
func TestSamplesRingFillsAndStaysBounded(t *testing.T) {
	const every = 20 * time.Millisecond
	c := open(t, manual, queen.SampleEvery(every))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "a"}, queen.Item{Partition: "a"}, queen.Item{Partition: "b"})
	msgs := pop(t, q, queen.PopOptions{Group: "g", Partition: "a", Batch: 10})
	if len(msgs) != 2 {
		t.Fatalf("popped %d messages of partition a, want 2", len(msgs))
	}
	if err := msgs[1].Ack(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	const acked = 2
	// Passes over more than two turns of the ring, and on to more than
	// one turn's samples where a pass outlasts an interval (on the
	// distributed layout a pass reads every shard: some 100 ms).
	deadline, bound := time.Now().Add(3*queen.SamplesKept*every), time.Now().Add(time.Minute)
	written := 0
	for time.Now().Before(deadline) || (written <= queen.SamplesKept && time.Now().Before(bound)) {
		written += maintain(t, c).Samples
		time.Sleep(every / 2)
	}
	if written <= queen.SamplesKept {
		t.Fatalf("passes wrote %d samples, want more than one turn of the ring (%d)", written, queen.SamplesKept)
	}
	if n := sampleRows(t, c, "q"); n > queen.SamplesKept {
		t.Fatalf("the ring holds %d rows of the queue, want at most %d", n, queen.SamplesKept)
	}
	got, err := q.Samples(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if got.Interval != every || len(got.Samples) < 2 || len(got.Samples) > queen.SamplesKept {
		t.Fatalf("interval %v, %d samples; want %v and 2..%d", got.Interval, len(got.Samples), every, queen.SamplesKept)
	}
	for i, s := range got.Samples {
		if s.At.After(got.Now) || got.Now.Sub(s.At) > queen.SamplesKept*every {
			t.Fatalf("sample %d at %v, outside the last %v before %v", i, s.At, queen.SamplesKept*every, got.Now)
		}
		if i > 0 && !s.At.After(got.Samples[i-1].At) {
			t.Fatalf("sample %d at %v not after sample %d at %v", i, s.At, i-1, got.Samples[i-1].At)
		}
		want := queen.Sample{At: s.At, Pushed: 3, Groups: []queen.GroupSample{{Group: "g", Consumed: acked, Lag: 3 - acked}}}
		if s.Pushed != want.Pushed || len(s.Groups) != 1 || s.Groups[0] != want.Groups[0] {
			t.Fatalf("sample %d = %+v, want %+v", i, s, want)
		}
	}

	// A deleted queue's rows go with it.
	if err := q.Delete(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := sampleRows(t, c, "q"); n != 0 {
		t.Fatalf("%d ring rows left of a deleted queue", n)
	}
	if got, err := q.Samples(ctxT(t)); err != nil || len(got.Samples) != 0 || got.Now.IsZero() {
		t.Fatalf("samples of a deleted queue: %+v, %v; want none, with the clock", got, err)
	}
}

// Of two processes running passes in one interval, only the first takes
// the samples: the other's pass writes none.
func TestSamplesTakenOncePerInterval(t *testing.T) {
	a := open(t, manual, queen.SampleEvery(time.Hour))
	b := open(t, manual, queen.SampleEvery(time.Hour), func(cfg *queen.Config) { cfg.Schema = a.Schema() })
	push(t, a.Queue("x"), queen.Item{})
	push(t, a.Queue("y"), queen.Item{}, queen.Item{})
	first := maintain(t, a).Samples
	if first != 2 {
		t.Fatalf("first pass wrote %d samples, want 2 (one per queue)", first)
	}
	if n := maintain(t, b).Samples; n != 0 {
		t.Fatalf("the other process's pass in the same interval wrote %d samples, want 0", n)
	}
	if n := maintain(t, a).Samples; n != 0 {
		t.Fatalf("a second pass in the same interval wrote %d samples, want 0", n)
	}
	got, err := b.Queue("y").Samples(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Samples) != 1 || got.Samples[0].Pushed != 2 || len(got.Samples[0].Groups) != 0 {
		t.Fatalf("samples of y: %+v, want one with 2 pushed and no group", got)
	}
}

// A bad queue name is refused before anything is read.
func TestSamplesBadName(t *testing.T) {
	c := open(t, manual)
	if _, err := c.Queue("").Samples(ctxT(t)); err == nil {
		t.Fatal("Samples of queue \"\": no error")
	}
}

// A queue whose delete commits while the pass's first sample of it waits
// on the queue row is left out of that round, not a foreign-key error
// failing the pass: the other queues get their samples.
func TestSamplesQueueDeletedMidPass(t *testing.T) {
	c := open(t, manual, queen.SampleEvery(time.Hour))
	push(t, c.Queue("keep"), queen.Item{})
	push(t, c.Queue("gone"), queen.Item{})
	ctx := ctxT(t)
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	var existed bool
	if err := tx.QueryRow(ctx, "SELECT "+pgx.Identifier{c.Schema()}.Sanitize()+".delete_queue($1, $2)",
		queen.DefaultTenant, "gone").Scan(&existed); err != nil || !existed {
		t.Fatalf("delete_queue: %v, %v", existed, err)
	}
	type result struct {
		rep queen.MaintenanceReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := c.Maintain(ctx)
		done <- result{rep, err}
	}()
	// The pass's insert waits on the deleted queue's row lock: on the
	// layout on a worker (a reference table's shard), which the
	// coordinator's pg_locks does not show; citus_lock_waits does.
	waits := "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)"
	if onLayout() {
		waits = "SELECT EXISTS (SELECT 1 FROM citus_lock_waits)"
	}
	for {
		var waiting bool
		if err := c.Pool().QueryRow(ctx, waits).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("pass ended before the delete committed: %+v, %v", r.rep, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !r.rep.Ran || r.rep.Samples != 1 {
		t.Fatalf("pass: %+v, %v; want it to run and sample the one queue left", r.rep, r.err)
	}
	got, err := c.Queue("keep").Samples(ctx)
	if err != nil || len(got.Samples) != 1 || got.Samples[0].Pushed != 1 {
		t.Fatalf("samples of keep: %+v, %v; want one, with 1 pushed", got, err)
	}
}

// A sample counts a group's lag as Queues does, partitions the group has
// not popped from yet included (their cursors are not there yet).
func TestSamplesLagAsQueues(t *testing.T) {
	c := open(t, manual, queen.SampleEvery(time.Hour))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "a"}, queen.Item{Partition: "a"}, queen.Item{Partition: "b"}, queen.Item{Partition: "c"})
	msgs := pop(t, q, queen.PopOptions{Partition: "a", Batch: 1})
	if err := msgs[0].Ack(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := maintain(t, c).Samples; n != 1 {
		t.Fatalf("pass wrote %d samples, want 1", n)
	}
	qs, err := c.Queues(ctxT(t))
	if err != nil || len(qs) != 1 || len(qs[0].Groups) != 1 {
		t.Fatalf("queues: %+v, %v", qs, err)
	}
	got, err := q.Samples(ctxT(t))
	if err != nil || len(got.Samples) != 1 {
		t.Fatalf("samples: %+v, %v", got, err)
	}
	want := queen.GroupSample{Group: "", Consumed: 1, Lag: qs[0].Groups[0].Lag}
	if s := got.Samples[0]; s.Pushed != qs[0].Pushed || len(s.Groups) != 1 || s.Groups[0] != want || want.Lag != 3 {
		t.Fatalf("sample %+v, want %d pushed and %+v (Queues: %+v)", s, qs[0].Pushed, want, qs[0])
	}
}

// BenchmarkTakeSamples: one round of the samples ring (the first pass of a
// minute) over many queues, each with partitions and a group's cursors,
// written straight into the tables; the clock row is reset before each
// round so every iteration writes every queue's row.
func BenchmarkTakeSamples(b *testing.B) {
	for _, n := range []int{100, 2000} {
		b.Run(strconv.Itoa(n)+"queues", func(b *testing.B) {
			c := open(b, manual)
			s := pgx.Identifier{c.Schema()}.Sanitize()
			ctx := ctxT(b)
			for _, sql := range []string{
				`INSERT INTO ` + s + `.queues (tenant, name) SELECT '00000000-0000-0000-0000-000000000000', 'q' || i FROM generate_series(1, $1) i`,
				`INSERT INTO ` + s + `.partitions (id, queue_id, name, last_offset) SELECT ` + s + `.partition_key(q.id, 'p' || k, 0), q.id, 'p' || k, 1000 FROM ` + s + `.queues q, generate_series(1, 4) k`,
				`INSERT INTO ` + s + `.subscriptions (queue_id, group_name, mode) SELECT id, '', 'all' FROM ` + s + `.queues`,
				`INSERT INTO ` + s + `.consumers (partition_id, group_name, committed) SELECT id, '', 500 FROM ` + s + `.partitions`,
			} {
				args := []any{}
				if strings.Contains(sql, "$1") {
					args = append(args, n)
				}
				if _, err := c.Pool().Exec(ctx, sql, args...); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				var w int
				if _, err := c.Pool().Exec(ctx, "UPDATE "+s+".samples_clock SET bucket = -1"); err != nil {
					b.Fatal(err)
				}
				if err := c.Pool().QueryRow(ctx, "SELECT "+s+".take_samples(60000, 60)").Scan(&w); err != nil || w != n {
					b.Fatalf("take_samples wrote %d rows (%v), want %d", w, err, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(n), "µs/queue")
		})
	}
}
