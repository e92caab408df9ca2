//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const riverSchema = "bench_river"

// noopArgs carries the same 200-byte JSON payload as a queen message.
type noopArgs struct {
	Payload json.RawMessage `json:"payload"`
}

func (noopArgs) Kind() string { return "noop" }

// noopWorker completes every job at once and counts it.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	done    atomic.Int64
	target  int64
	reached chan struct{}
	once    sync.Once
}

func (w *noopWorker) Work(context.Context, *river.Job[noopArgs]) error {
	if w.done.Add(1) == w.target {
		w.once.Do(func() { close(w.reached) })
	}
	return nil
}

func (b *bench) riverPool(ctx context.Context, conns int32) (*pgxpool.Pool, error) {
	pc := b.base.Config().Copy()
	pc.MaxConns = conns
	return pgxpool.NewWithConfig(ctx, pc)
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// riverMigrate creates River's schema and tables (rivermigrate), if not
// there yet.
func riverMigrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+riverSchema); err != nil {
		return err
	}
	mig, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: riverSchema, Logger: quietLogger()})
	if err != nil {
		return err
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("rivermigrate: %w", err)
	}
	return nil
}

// riverInsert: River InsertMany of 1000 no-op jobs per call from 8
// goroutines, after migrating River's schema with rivermigrate.
func (b *bench) riverInsert(ctx context.Context) (*result, error) {
	pool, err := b.riverPool(ctx, 16)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := riverMigrate(ctx, pool); err != nil {
		return nil, err
	}
	driver := riverpgxv5.New(pool)
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{})
	// No Queues: an insert-only client.
	client, err := river.NewClient(driver, &river.Config{Schema: riverSchema, Workers: workers, Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	params := make([][]river.InsertManyParams, 8)
	for g := range params {
		params[g] = make([]river.InsertManyParams, batchSize)
	}
	n := int64(b.cfg.nBatch)
	lr, err := load(ctx, 8, n/batchSize, b.cfg.maxTime, func(g int, i int64) error {
		p := params[g]
		for k := range p {
			p[k] = river.InsertManyParams{Args: noopArgs{Payload: b.payloads[(i*batchSize+int64(k))%int64(len(b.payloads))]}}
		}
		_, err := client.InsertMany(ctx, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	r := lr.result("River v0.51.2: InsertMany of 1000 jobs, 8 goroutines", batchSize, n)
	b.riverBacklog = r.Msgs
	return r, nil
}

// riverDrain: River workers complete no-op jobs inserted by riverInsert;
// the clock runs from Start until Stop returns after the target count was
// worked, so the completer's last batch is in.
func (b *bench) riverDrain(ctx context.Context) (*result, error) {
	target := min(int64(b.cfg.nDrain), b.riverBacklog)
	name := fmt.Sprintf("River v0.51.2: workers complete no-op jobs (MaxWorkers %d)", b.cfg.riverWork)
	if target == 0 {
		return &result{Name: name, Unavailable: "no River jobs to drain (run river-insert in the same invocation)"}, nil
	}
	pool, err := b.riverPool(ctx, 32)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	w := &noopWorker{target: target, reached: make(chan struct{})}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	rc := &river.Config{
		Schema:                      riverSchema,
		Workers:                     workers,
		Queues:                      map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: b.cfg.riverWork}},
		FetchCooldown:               b.cfg.riverFetch,
		CompletedJobRetentionPeriod: 24 * time.Hour,
		Logger:                      quietLogger(),
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	capped := false
	select {
	case <-w.reached:
	case <-time.After(b.cfg.maxTime):
		capped = true
	case <-ctx.Done():
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return nil, fmt.Errorf("river stop: %w", err)
	}
	el := time.Since(start)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	done := min(w.done.Load(), target)
	var completed int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{riverSchema, "river_job"}.Sanitize()+" WHERE state = 'completed'").Scan(&completed); err != nil {
		return nil, err
	}
	return &result{
		Name: name, Msgs: done, Target: target, Seconds: el.Seconds(), Capped: capped,
		Note: fmt.Sprintf("%d jobs in state completed after Stop", completed),
	}, nil
}

// e2eArgs is a River job of the end-to-end scenarios: the schedule's
// sequence number and scheduled send time, and the usual payload.
type e2eArgs struct {
	Seq     int64           `json:"seq"`
	Sched   int64           `json:"sched"`
	Payload json.RawMessage `json:"payload"`
}

func (e2eArgs) Kind() string { return "e2e" }

// e2eWorker records when each job starts.
type e2eWorker struct {
	river.WorkerDefaults[e2eArgs]
	rec *e2eRecorder
}

func (w *e2eWorker) Work(_ context.Context, j *river.Job[e2eArgs]) error {
	w.rec.record(j.Args.Seq, j.Args.Sched)
	return nil
}

// riverE2EConns is the River pool size of the end-to-end scenarios: each
// Insert is its own transaction, so the 500 senders need connections.
const riverE2EConns = 64

// riverE2E: River Insert of one job per call, at the scheduled send times of
// the same open-loop schedule as queen's, into a River client that works
// them (MaxWorkers -river-workers, FetchCooldown -river-e2e-fetch-cooldown,
// the rest River's defaults); latency is scheduled send to worker start. The
// same client inserts and works, so its insert notifications are throttled
// by the same FetchCooldown.
func (b *bench) riverE2E(c e2eCase) func(context.Context) (*result, error) {
	return func(ctx context.Context) (*result, error) {
		total := int64(float64(c.rate) * b.cfg.e2eDur.Seconds())
		name := fmt.Sprintf("River v0.51.2: end to end at %s msgs/s, MaxWorkers %d, FetchCooldown %s",
			fmtInt(float64(c.rate)), b.cfg.riverWork, b.cfg.riverE2EFC)
		if total <= 0 {
			return &result{Name: name, Unavailable: "-e2e-time is zero"}, nil
		}
		pool, err := b.riverPool(ctx, riverE2EConns)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		if err := riverMigrate(ctx, pool); err != nil {
			return nil, err
		}
		// Start empty: no jobs of earlier scenarios (of other kinds) in the way.
		if _, err := pool.Exec(ctx, "TRUNCATE "+pgx.Identifier{riverSchema, "river_job"}.Sanitize()); err != nil {
			return nil, err
		}
		rec := newE2ERecorder(total)
		workers := river.NewWorkers()
		river.AddWorker(workers, &e2eWorker{rec: rec})
		client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
			Schema:        riverSchema,
			Workers:       workers,
			Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: b.cfg.riverWork}},
			FetchCooldown: b.cfg.riverE2EFC,
			Logger:        quietLogger(),
		})
		if err != nil {
			return nil, err
		}
		return runE2E(ctx, name, c, rec, func() (func() error, error) {
			if err := client.Start(ctx); err != nil {
				return nil, err
			}
			return func() error {
				sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := client.Stop(sctx); err != nil {
					return fmt.Errorf("river stop: %w", err)
				}
				return nil
			}, nil
		}, func(seq, sched int64) error {
			_, err := client.Insert(ctx, e2eArgs{Seq: seq, Sched: sched, Payload: b.payloads[seq%int64(len(b.payloads))]}, nil)
			return err
		})
	}
}
