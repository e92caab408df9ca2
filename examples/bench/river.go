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

// riverInsert: River InsertMany of 1000 no-op jobs per call from 8
// goroutines, after migrating River's schema with rivermigrate.
func (b *bench) riverInsert(ctx context.Context) (*result, error) {
	pool, err := b.riverPool(ctx, 16)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+riverSchema); err != nil {
		return nil, err
	}
	driver := riverpgxv5.New(pool)
	mig, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: riverSchema, Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("rivermigrate: %w", err)
	}
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
