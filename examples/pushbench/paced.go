package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
)

// pacedRate is the rate of the paced blocks: the end-to-end target's.
const pacedRate = 100

// paced compares, on one client, the same calls made back to back and paced
// at pacedRate (each started on a schedule, the caller asleep in between):
// SELECT 1, a single-row INSERT commit, a push with no consumer, and a push
// to a partition on which a Consume worker lingers (the push takes the
// message for it: push_take). The kinds alternate in blocks of 100 calls,
// which goes first rotating each round, so each meets the same machine.
// A pgx tracer splits each INSERT and push call into the client's work
// before its statement is sent, the statement (sent to reply read, the
// commit included) and the client's work after it.
func paced(ctx context.Context, url string, payload []byte) error {
	tr := &stmtTracer{}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pc.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	client, err := queen.Open(ctx, queen.Config{Pool: pool, Schema: "pushbench"})
	if err != nil {
		return err
	}
	defer client.Close(ctx)
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS pushbench_paced (id bigserial, data bytea)"); err != nil {
		return err
	}
	idle, linger := client.Queue("paced-idle"), client.Queue("paced-linger")
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- linger.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 1}, Concurrency: 1},
			func(context.Context, *queen.Message) error { return nil })
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(500 * time.Millisecond) // the worker parks

	type kind struct {
		name string
		call func() error
	}
	kinds := []kind{
		{"SELECT 1", func() error { _, err := pool.Exec(ctx, "SELECT 1"); return err }},
		{"INSERT commit", func() error {
			_, err := pool.Exec(ctx, "INSERT INTO pushbench_paced (data) VALUES ($1)", payload)
			return err
		}},
		{"push, no consumer", func() error {
			_, err := idle.Push(ctx, []queen.Item{{Data: payload, Partition: "p"}})
			return err
		}},
		{"push, a worker lingers (take)", func() error {
			_, err := linger.Push(ctx, []queen.Item{{Data: payload, Partition: "p"}})
			return err
		}},
	}
	type stats struct{ call, pre, stmt, post []time.Duration }
	type mode struct {
		k     int
		paced bool
	}
	var modes []mode
	for k := range kinds {
		modes = append(modes, mode{k, false}, mode{k, true})
	}
	res := make([]stats, len(modes))
	const block = 100
	interval := time.Second / pacedRate
	for r := -1; r*block < *pacedN; r++ { // round -1 is unmeasured
		for j := range modes {
			m := modes[(j+max(r, 0))%len(modes)]
			s := &res[(j+max(r, 0))%len(modes)]
			start := time.Now()
			for i := range block {
				if m.paced {
					sleepUntil(start.Add(time.Duration(i+1) * interval))
				}
				t := time.Now()
				if err := kinds[m.k].call(); err != nil {
					return fmt.Errorf("%s: %w", kinds[m.k].name, err)
				}
				end := time.Now()
				if r < 0 {
					continue
				}
				s.call = append(s.call, end.Sub(t))
				if a, b := tr.start.Load(), tr.end.Load(); a >= t.UnixNano() && b >= a {
					s.pre = append(s.pre, time.Duration(a-t.UnixNano()))
					s.stmt = append(s.stmt, time.Duration(b-a))
					s.post = append(s.post, time.Duration(end.UnixNano()-b))
				}
			}
		}
	}
	fmt.Printf("\npaced at %d calls/s against back to back, alternating blocks of %d (p50; the INSERT's and push's call split by a pgx tracer)\n", pacedRate, block)
	fmt.Printf("%-32s %-13s %9s %9s %9s | %9s %9s %9s\n", "call", "", "p25", "p50", "p75", "before", "statement", "after")
	var insB2B, insPaced time.Duration
	for i, m := range modes {
		s := res[i]
		how := "back to back"
		if m.paced {
			how = "paced"
		}
		split := ""
		if len(s.stmt) > 0 {
			split = fmt.Sprintf("| %9s %9s %9s", us(pct(s.pre, 50)), us(pct(s.stmt, 50)), us(pct(s.post, 50)))
		}
		fmt.Printf("%-32s %-13s %9s %9s %9s %s\n", kinds[m.k].name, how, us(pct(s.call, 25)), us(pct(s.call, 50)), us(pct(s.call, 75)), split)
		if m.k == 1 {
			if m.paced {
				insPaced = pct(s.call, 50)
			} else {
				insB2B = pct(s.call, 50)
			}
		}
	}
	fmt.Printf("  paced INSERT p50 / back-to-back INSERT p50 = %.2f\n", float64(insPaced)/float64(insB2B))
	return nil
}

func us(d time.Duration) string { return fmt.Sprintf("%dµs", d.Microseconds()) }

// stmtTracer records when the last INSERT or push statement was handed to
// pgx and when its reply had been read; calls are made one at a time.
type stmtTracer struct{ start, end atomic.Int64 }

type tracedKey struct{}

// traced: the INSERT, or the push statement (AppendSegment, alone or in a
// pipeline with push_take).
func traced(sql string) bool {
	return strings.HasPrefix(sql, "INSERT INTO pushbench_paced") || strings.Contains(sql, "qq.dedup_")
}

func (t *stmtTracer) begin(ctx context.Context) context.Context {
	t.start.Store(time.Now().UnixNano())
	return context.WithValue(ctx, tracedKey{}, true)
}

func (t *stmtTracer) finish(ctx context.Context) {
	if ctx.Value(tracedKey{}) != nil {
		t.end.Store(time.Now().UnixNano())
	}
}

func (t *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if traced(d.SQL) {
		return t.begin(ctx)
	}
	return ctx
}

func (t *stmtTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	t.finish(ctx)
}

func (t *stmtTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if traced(q.SQL) {
			return t.begin(ctx)
		}
	}
	return ctx
}

func (t *stmtTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t *stmtTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	t.finish(ctx)
}
