package queen_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
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
	tbl := pgx.Identifier{c.Schema(), "scheduled"}.Sanitize()
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
		far := time.Now().Add(time.Hour)
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
		if _, err := c.Pool().Exec(ctx, "UPDATE "+tbl+" SET due_at = clock_timestamp() + (id - (SELECT min(id) FROM "+tbl+
			")) * $1::float8 * interval '1 microsecond'", float64(span.Microseconds())/n); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		moving := pushFor(window)
		var left int
		for {
			if err := c.Pool().QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&left); err != nil {
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
		if _, err := c.Pool().Exec(ctx, "UPDATE "+tbl+" SET due_at = clock_timestamp()"); err != nil {
			b.Fatal(err)
		}
		for left := 1; left > 0 && time.Since(alone) < 5*time.Minute; {
			time.Sleep(20 * time.Millisecond)
			if err := c.Pool().QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&left); err != nil {
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
