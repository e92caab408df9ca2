package queen_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// How late an idle scheduled message arrives: one message at a time, due
// 100ms after its push, popped by a waiting consumer. Reports the p50 and
// p95 of arrival minus due time.
//
//	go test -run '^$' -bench ScheduledLatency -benchtime 50x .
func BenchmarkScheduledLatency(b *testing.B) {
	q := open(b).Queue("latency")
	ctx := context.Background()
	var late []time.Duration
	for i := 0; b.Loop(); i++ {
		due := time.Now().Add(100 * time.Millisecond)
		if _, err := q.Push(ctx, []queen.Item{{Data: benchPayload, DeliverAt: due}}); err != nil {
			b.Fatal(err)
		}
		for {
			msgs, err := q.Pop(ctx, queen.PopOptions{AutoAck: true, Wait: 5 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			if len(msgs) > 0 {
				late = append(late, time.Since(due))
				break
			}
		}
	}
	slices.Sort(late)
	b.ReportMetric(float64(late[len(late)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(late[len(late)*95/100].Microseconds())/1000, "p95_ms")
}

// Live pushes beside a large move: n scheduled messages (held far ahead,
// then made due over span by an UPDATE, so scheduling them is not
// measured) are moved while 8 goroutines push 100-item batches; the same
// pushes run for the same time with nothing due as the baseline. Reports
// both push rates, the slowdown and the move rate, and the move rate of
// n messages due at once with no pushes beside.
//
//	go test -run '^$' -bench ScheduledMove -benchtime 1x .
func BenchmarkScheduledMove(b *testing.B) {
	const (
		n      = 100_000
		span   = 2 * time.Second
		window = 6 * time.Second
	)
	c := open(b)
	ctx := context.Background()
	live := c.Queue("live")
	sched := c.Queue("sched")
	pushFor := func(d time.Duration) float64 {
		var total atomic.Int64
		stop := time.Now().Add(d)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				items := make([]queen.Item, 100)
				for i := range items {
					items[i] = queen.Item{Data: benchPayload, Partition: fmt.Sprintf("p%d", g)}
				}
				for time.Now().Before(stop) {
					if _, err := live.Push(ctx, items); err != nil {
						b.Error(err)
						return
					}
					total.Add(int64(len(items)))
				}
			})
		}
		start := time.Now()
		wg.Wait()
		return float64(total.Load()) / time.Since(start).Seconds()
	}
	for b.Loop() {
		b.StopTimer()
		far := time.Now().Add(30 * time.Minute)
		for k := 0; k < n; k += 1000 {
			items := make([]queen.Item, 1000)
			for i := range items {
				items[i] = queen.Item{Data: benchPayload, Partition: fmt.Sprintf("s%d", (k+i)%64), DeliverAt: far}
			}
			if _, err := sched.Push(ctx, items); err != nil {
				b.Fatal(err)
			}
		}
		base := pushFor(window)
		// Due from now over span, in id (schedule) order.
		if err := execSched(ctx, c, "UPDATE %[1]s SET due_at = clock_timestamp() + (id - (SELECT min(id) FROM %[1]s))"+
			" * $1::float8 * interval '1 microsecond'", float64(span.Microseconds())/n); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		moving := pushFor(window)
		var left int
		for {
			if err := scheduledLeft(ctx, c, &left); err != nil {
				b.Fatal(err)
			}
			if left == 0 || time.Since(start) > 5*time.Minute {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		moved := time.Since(start)
		// The move alone: all due at once, nothing else running.
		for k := 0; k < n; k += 1000 {
			items := make([]queen.Item, 1000)
			for i := range items {
				items[i] = queen.Item{Data: benchPayload, Partition: fmt.Sprintf("s%d", (k+i)%64), DeliverAt: far}
			}
			if _, err := sched.Push(ctx, items); err != nil {
				b.Fatal(err)
			}
		}
		alone := time.Now()
		if err := execSched(ctx, c, "UPDATE %s SET due_at = clock_timestamp()"); err != nil {
			b.Fatal(err)
		}
		for left := 1; left > 0 && time.Since(alone) < 5*time.Minute; {
			time.Sleep(20 * time.Millisecond)
			if err := scheduledLeft(ctx, c, &left); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n)/time.Since(alone).Seconds(), "moved/s_alone")
		b.ReportMetric(base, "live_msgs/s_idle")
		b.ReportMetric(moving, "live_msgs/s_moving")
		b.ReportMetric(100*(base-moving)/base, "slowdown_%")
		b.ReportMetric(float64(n)/moved.Seconds(), "moved/s")
		if left != 0 {
			b.Fatalf("%d still scheduled", left)
		}
	}
}

var (
	schedN    = flag.Int("sched.n", 1_000_000, "BenchmarkScheduledDueOverAMinute: scheduled messages per loaded block")
	schedSpan = flag.Duration("sched.span", time.Minute, "BenchmarkScheduledDueOverAMinute: the span they fall due over")
)

// The scheduled-delivery promise: 1,000,000 scheduled messages falling due
// evenly over a minute are moved at their time while live pushes run, and
// slow those pushes by at most 10%. On its own production-like cluster
// (pgcluster.Production: fsync on, 512MB shared_buffers), two rounds of a
// baseline block (8 goroutines pushing 100-item batches, nothing due, for
// the span) and a loaded block (the same pushes while the messages fall
// due). The messages are scheduled half an hour ahead before each round, so
// scheduling them is not measured, then made due by an UPDATE. Reports the
// live push rates, the slowdown (loaded against baseline, both rounds
// summed), the move rate (messages over the time from the first due to the
// last moved) and the lateness (append time, the segment's created_at, minus
// due time; p50, p99 and max over every message of both rounds), read back
// by popping the moved messages after each round.
//
//	go test -run '^$' -bench ScheduledDueOverAMinute -benchtime 1x -timeout 60m .
//
// -sched.n and -sched.span scale it down for a quick look.
func BenchmarkScheduledDueOverAMinute(b *testing.B) {
	const goroutines, batch, partitions = 8, 100, 64
	n, span := *schedN, *schedSpan
	if n <= 0 || span <= 0 {
		b.Fatalf("-sched.n %d and -sched.span %s must be positive", n, span)
	}
	cl := pgtest.NewCluster(b, pgcluster.Production())
	ctx := context.Background()
	c, err := queen.Open(ctx, queen.Config{
		DatabaseURL: cl.URL,
		Schema:      "bench",
		Logger:      quietLogger(),
		SpoolDir:    b.TempDir(),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			b.Error(err)
		}
	})
	live := c.Queue("live")
	sched := c.Queue("sched")
	step := span / time.Duration(n)
	pushFor := func(d time.Duration) float64 {
		var total atomic.Int64
		stop := time.Now().Add(d)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				items := make([]queen.Item, batch)
				for i := range items {
					items[i] = queen.Item{Data: benchPayload, Partition: fmt.Sprintf("p%d", g)}
				}
				for time.Now().Before(stop) {
					if _, err := live.Push(ctx, items); err != nil {
						b.Error(err)
						return
					}
					total.Add(int64(len(items)))
				}
			})
		}
		start := time.Now()
		wg.Wait()
		return float64(total.Load()) / time.Since(start).Seconds()
	}
	var base, loaded, moveRate []float64
	var late []time.Duration
	// CPU seconds (this process, the server) spent in each block: the
	// extra a loaded block spends over its baseline, per moved message,
	// is the move's cost, which other work on the machine does not skew
	// the way it skews the rates.
	var baseCPU, loadedCPU [2]float64
	var baseLive, loadedLive float64
	cpuNow := func() [2]float64 { return [2]float64{processCPU(), serverCPU(cl.Pid())} }
	for b.Loop() {
		for range 2 {
			b.StopTimer()
			// Item i falls due at far + i*step; the UPDATE below shifts
			// them all to start at t0, so i in the payload gives its due.
			far := time.Now().Add(30 * time.Minute).Truncate(time.Millisecond)
			for k := 0; k < n; k += 1000 {
				items := make([]queen.Item, min(1000, n-k))
				for i := range items {
					p := slices.Clone(benchPayload)
					copy(p, fmt.Sprintf("%010d", k+i))
					items[i] = queen.Item{Data: p, Partition: fmt.Sprintf("s%d", (k+i)%partitions),
						DeliverAt: far.Add(time.Duration(k+i) * step)}
				}
				res, err := sched.Push(ctx, items)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r.Status != queen.Scheduled {
						b.Fatalf("scheduling: %v %v", r.Status, r.Err)
					}
				}
			}
			// Due from t0, leaving time for the UPDATE and VACUUM and then
			// the baseline block (nothing due yet) before it.
			t0 := time.Now().Add(span + time.Minute).Truncate(time.Millisecond)
			if err := execSched(ctx, c, "UPDATE %s SET due_at = due_at - $1::interval", far.Sub(t0)); err != nil {
				b.Fatal(err)
			}
			if err := execSched(ctx, c, "VACUUM ANALYZE %s"); err != nil {
				b.Fatal(err)
			}
			d := min(span, time.Until(t0)-time.Second)
			if d < span/2 {
				b.Fatalf("the UPDATE and VACUUM left %s of the baseline block's %s", d, span)
			}
			b.StartTimer()
			c0 := cpuNow()
			base = append(base, pushFor(d))
			c1 := cpuNow()
			baseCPU[0] += c1[0] - c0[0]
			baseCPU[1] += c1[1] - c0[1]
			baseLive += base[len(base)-1] * d.Seconds()
			b.StopTimer()
			time.Sleep(time.Until(t0))
			b.StartTimer()
			c0 = cpuNow()
			loaded = append(loaded, pushFor(span))
			var left int
			for {
				// Through the due index: a count(*) would scan the table.
				if err := scheduledLeft(ctx, c, &left); err != nil {
					b.Fatal(err)
				}
				if left == 0 || time.Since(t0) > 10*span {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			moveRate = append(moveRate, float64(n)/time.Since(t0).Seconds())
			c1 = cpuNow()
			loadedCPU[0] += c1[0] - c0[0]
			loadedCPU[1] += c1[1] - c0[1]
			loadedLive += loaded[len(loaded)-1] * span.Seconds()
			b.StopTimer()
			if err := scheduledLeft(ctx, c, &left); err != nil {
				b.Fatal(err)
			}
			if left != 0 {
				b.Fatalf("%d still scheduled after %s", left, 10*span)
			}
			for got := 0; got < n; {
				msgs, err := sched.Pop(ctx, queen.PopOptions{AutoAck: true, Batch: 1000, Partitions: partitions})
				if err != nil {
					b.Fatal(err)
				}
				if len(msgs) == 0 {
					b.Fatalf("popped %d of %d moved messages", got, n)
				}
				for _, m := range msgs {
					i, err := strconv.Atoi(string(m.Data[:10]))
					if err != nil {
						b.Fatal(err)
					}
					late = append(late, m.CreatedAt.Sub(t0.Add(time.Duration(i)*step)))
				}
				got += len(msgs)
			}
			b.StartTimer()
		}
	}
	slices.Sort(late)
	sum := func(v []float64) (s float64) {
		for _, x := range v {
			s += x
		}
		return s
	}
	for k := range base {
		b.Logf("round %d: live %.0f/s baseline, %.0f/s loaded; moved %.0f/s", k+1, base[k], loaded[k], moveRate[k])
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	// Per live message at baseline, the rest of a loaded block's CPU is
	// the move's.
	for i, name := range []string{"client", "server"} {
		perLive := baseCPU[i] / baseLive
		move := loadedCPU[i] - perLive*loadedLive
		b.Logf("%s CPU: %.2f µs per live message at baseline; the move %.1f µs per moved message", name, perLive*1e6, move/float64(len(loaded)*n)*1e6)
		b.ReportMetric(move/float64(len(loaded)*n)*1e6, "move_"+name+"_cpu_µs/msg")
	}
	b.ReportMetric(sum(base)/float64(len(base)), "live_msgs/s_idle")
	b.ReportMetric(sum(loaded)/float64(len(loaded)), "live_msgs/s_moving")
	b.ReportMetric(100*(sum(base)-sum(loaded))/sum(base), "slowdown_%")
	b.ReportMetric(slices.Min(moveRate), "moved/s")
	b.ReportMetric(ms(late[len(late)/2]), "late_p50_ms")
	b.ReportMetric(ms(late[len(late)*99/100]), "late_p99_ms")
	b.ReportMetric(ms(late[len(late)-1]), "late_max_ms")
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("load average at the end: %s", strings.TrimSpace(string(load)))
	}
}

// quietLogger logs warnings and errors only: a benchmark's b.Log output is
// cut after a few lines, which debug summaries would fill.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// processCPU is this process's user and system CPU time in seconds.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// serverCPU is the CPU time in seconds of a postmaster and its children
// now running, from /proc (Linux; 0 elsewhere). A child that exited
// meanwhile is missed: the figures are for blocks of tens of seconds,
// where autovacuum's and checkpointer's work shows as long-lived children.
func serverCPU(postmaster int) float64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command, which is in parentheses and may hold spaces.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != postmaster && ppid != postmaster {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
	}
	return float64(ticks) / 100 // USER_HZ
}

// The move's own cost: -sched.n scheduled messages over 64 partitions
// fall due evenly over -sched.span with nothing else running, moved by the
// client's mover. Reports the CPU of this process and of the server (its
// processes alive at the end) from the first due time until the last is
// moved, per moved message: on a shared machine a steadier figure than
// the live-push slowdown it causes.
//
//	go test -run '^$' -bench ScheduledMoveCPU -benchtime 1x -sched.n 300000 -sched.span 20s .
func BenchmarkScheduledMoveCPU(b *testing.B) {
	n, span := *schedN, *schedSpan
	if n <= 0 || span <= 0 {
		b.Fatalf("-sched.n %d and -sched.span %s must be positive", n, span)
	}
	cl := pgtest.NewCluster(b, pgcluster.Production())
	ctx := context.Background()
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: cl.URL, Schema: "bench", Logger: quietLogger(), SpoolDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			b.Error(err)
		}
	})
	sched := c.Queue("sched")
	step := span / time.Duration(n)
	var client, server float64
	var wal walStats
	for b.Loop() {
		b.StopTimer()
		far := time.Now().Add(30 * time.Minute).Truncate(time.Millisecond)
		for k := 0; k < n; k += 1000 {
			items := make([]queen.Item, min(1000, n-k))
			for i := range items {
				items[i] = queen.Item{Data: benchPayload, Partition: fmt.Sprintf("s%d", (k+i)%64),
					DeliverAt: far.Add(time.Duration(k+i) * step)}
			}
			if _, err := sched.Push(ctx, items); err != nil {
				b.Fatal(err)
			}
		}
		// Time for the UPDATE, VACUUM and CHECKPOINT before the first due:
		// a measurement that starts after it misses the first moves (with
		// 5 s, at load 10, main's started up to 10 s late).
		t0 := time.Now().Add(30 * time.Second).Truncate(time.Millisecond)
		if err := execSched(ctx, c, "UPDATE %s SET due_at = due_at - $1::interval", far.Sub(t0)); err != nil {
			b.Fatal(err)
		}
		if err := execSched(ctx, c, "VACUUM ANALYZE %s"); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Pool().Exec(ctx, "CHECKPOINT"); err != nil {
			b.Fatal(err)
		}
		if late := time.Since(t0); late > 0 {
			b.Fatalf("the measurement starts %s after the first due time", late)
		}
		time.Sleep(time.Until(t0))
		b.StartTimer()
		p0, s0 := processCPU(), serverCPU(cl.Pid())
		w0, err := readWAL(ctx, c.Pool())
		if err != nil {
			b.Fatal(err)
		}
		for {
			var left int
			if err := scheduledLeft(ctx, c, &left); err != nil {
				b.Fatal(err)
			}
			if left == 0 {
				break
			}
			if time.Since(t0) > 10*span {
				b.Fatalf("still scheduled after %s", 10*span)
			}
			time.Sleep(50 * time.Millisecond)
		}
		client += processCPU() - p0
		server += serverCPU(cl.Pid()) - s0
		w1, err := readWAL(ctx, c.Pool())
		if err != nil {
			b.Fatal(err)
		}
		wal.bytes += w1.bytes - w0.bytes
		wal.fpi += w1.fpi - w0.fpi
		wal.records += w1.records - w0.records
	}
	moved := float64(b.N * n)
	b.ReportMetric(wal.bytes/moved, "wal_B/msg")
	b.ReportMetric(wal.fpi/moved, "wal_fpi/msg")
	b.ReportMetric(wal.records/moved, "wal_records/msg")
	b.ReportMetric(client/moved*1e6, "client_cpu_µs/msg")
	b.ReportMetric(server/moved*1e6, "server_cpu_µs/msg")
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("load average at the end: %s", strings.TrimSpace(string(load)))
	}
}

// walStats is pg_stat_wal's counters: what a moved message writes to the
// WAL, which it shares with every commit on the server.
type walStats struct{ bytes, fpi, records float64 }

func readWAL(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (walStats, error) {
	var w walStats
	err := q.QueryRow(ctx, "SELECT wal_bytes::float8, wal_fpi::float8, wal_records::float8 FROM pg_stat_wal").Scan(&w.bytes, &w.fpi, &w.records)
	return w, err
}

// execSched runs query, its %s the table, on both tables scheduled
// messages wait in: the generations (due within the hour, where these
// benchmarks schedule) and the per-row table.
func execSched(ctx context.Context, c *queen.Client, query string, args ...any) error {
	for _, t := range []string{"scheduled_gen", "scheduled"} {
		if _, err := c.Pool().Exec(ctx, fmt.Sprintf(query, pgx.Identifier{c.Schema(), t}.Sanitize()), args...); err != nil {
			return err
		}
	}
	return nil
}

// scheduledLeft sets left to 0 when no message waits to be moved (none
// above the watermark in the generations, none not held in scheduled),
// else to 1 or 2, through the due indexes (a count(*) would scan; so
// would a join with the state row: its watermark is a parameter here).
func scheduledLeft(ctx context.Context, c *queen.Client, left *int) error {
	id := func(t string) string { return pgx.Identifier{c.Schema(), t}.Sanitize() }
	return c.Pool().QueryRow(ctx, "SELECT (SELECT count(*) FROM (SELECT 1 FROM "+id("scheduled")+
		" WHERE NOT held ORDER BY due_at, id LIMIT 1) x) + (SELECT count(*) FROM (SELECT 1 FROM "+id("scheduled_gen")+
		" g WHERE ROW(g.due_at, g.id) > ROW((SELECT wm_due FROM "+id("scheduled_state")+"), (SELECT wm_id FROM "+id("scheduled_state")+
		")) ORDER BY g.due_at, g.id LIMIT 1) y)").
		Scan(left)
}

// The scheduling call itself: pushes of items with a DeliverAt an hour
// ahead, one call at a time, 1 or 100 items a call (each call a
// transaction of its own, committed once its statement answered).
//
//	go test -run '^$' -bench SchedulePush -benchtime 2000x .
func BenchmarkSchedulePush(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			q := open(b).Queue("schedpush")
			ctx := context.Background()
			items := make([]queen.Item, n)
			for i := 0; b.Loop(); i++ {
				due := time.Now().Add(time.Hour)
				for k := range items {
					items[k] = queen.Item{Data: benchPayload, DeliverAt: due}
				}
				res, err := q.Push(ctx, items)
				if err != nil {
					b.Fatal(err)
				}
				if res[0].Status != queen.Scheduled {
					b.Fatalf("%+v", res[0])
				}
			}
		})
	}
}
