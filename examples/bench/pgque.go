//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/queentest/pgcluster"
)

// PgQue beside the lifecycle workload: the same keys × events, loaded by 8
// loaders with 1000 keyed sends per transaction, drained by 16 workers, each
// holding one of 16 partition-key slots (claim_slot) and looping
// receive_partitioned + ack_partitioned, with per-key order checked; a
// ticker goroutine calls pgque.ticker() every 10 ms throughout. PgQue is not
// vendored: -lifecycle-pgque names its single-file install
// (devel/sql/pgque.sql of a PgQue checkout, 0.3.0-devel, which has
// partition keys), run with psql into a fresh database of the cluster.

const (
	pgqSlots = 16
	pgqQueue = "lifecycle"
)

// pgqInstall creates database name and runs the install script in it.
func pgqInstall(ctx context.Context, base *pgxpool.Pool, url, name, script string) (string, error) {
	if _, err := base.Exec(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
		return "", err
	}
	if _, err := base.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "", err
	}
	dbURL := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	psql, err := exec.LookPath("psql")
	if err != nil {
		bin, ferr := pgcluster.FindBinaries()
		if ferr != nil {
			return "", fmt.Errorf("psql: %w", ferr)
		}
		psql = filepath.Join(bin, "psql")
	}
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "--single-transaction", "-v", "ON_ERROR_STOP=1",
		"-d", dbURL, "-f", script)
	cmd.Env = append(os.Environ(), "PAGER=cat")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("installing PgQue from %s: %w\n%s", script, err, out)
	}
	return dbURL, nil
}

// pgqOnce loads and drains the lifecycle workload through PgQue once, in a
// fresh database.
func pgqOnce(ctx context.Context, base *pgxpool.Pool, url string, postmaster, run int) (lcRun, error) {
	out := lcRun{Run: run}
	dbURL, err := pgqInstall(ctx, base, url, fmt.Sprintf("bench_pgque_%d", run), lc.pgque)
	if err != nil {
		return out, err
	}
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return out, err
	}
	pcfg.MaxConns = lcWorkers + lcLoaders + 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return out, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "SELECT pgque.create_queue($1)", pgqQueue); err != nil {
		return out, err
	}
	for k := range pgqSlots {
		if _, err := pool.Exec(ctx, "SELECT pgque.subscribe_slot($1, 'main', $2, $3)", pgqQueue, k, pgqSlots); err != nil {
			return out, err
		}
	}
	// The ticker, every 10 ms until the drain is over.
	tctx, stopTicker := context.WithCancel(ctx)
	var tickers sync.WaitGroup
	tickers.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-t.C:
				_, _ = pool.Exec(tctx, "SELECT pgque.ticker()")
			}
		}
	})
	defer func() { stopTicker(); tickers.Wait() }()

	total := int64(lc.keys) * int64(lc.events)
	keys := partNames(lc.keys)
	load, err := lcMeasure(postmaster, total, func() error {
		lctx, cancel := context.WithTimeout(ctx, lc.maxTime)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, lcLoaders)
		for l := range lcLoaders {
			wg.Go(func() {
				payloads := make([]string, 0, lcCall)
				pkeys := make([]string, 0, lcCall)
				flush := func() bool {
					_, err := pool.Exec(lctx, `SELECT count(pgque.send($1, 'ev', u.p, u.k)) FROM unnest($2::text[], $3::text[]) AS u(p, k)`,
						pgqQueue, payloads, pkeys)
					if err != nil {
						errs <- err
						return false
					}
					payloads, pkeys = payloads[:0], pkeys[:0]
					return true
				}
				for j := range lc.events {
					for k := l; k < lc.keys; k += lcLoaders {
						payloads = append(payloads, string(lcPayload(k, j)))
						pkeys = append(pkeys, keys[k])
						if len(payloads) == lcCall && !flush() {
							return
						}
					}
				}
				if len(payloads) > 0 {
					flush()
				}
			})
		}
		wg.Wait()
		close(errs)
		return <-errs
	})
	if err != nil {
		return out, fmt.Errorf("PgQue run %d load: %w", run, err)
	}
	out.Load = load

	next := make([]atomic.Int32, lc.keys)
	var violations, received atomic.Int64
	drain, err := lcMeasure(postmaster, total, func() error {
		dctx, cancel := context.WithTimeout(ctx, lc.maxTime)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, pgqSlots)
		for w := range pgqSlots {
			wg.Go(func() {
				worker := fmt.Sprintf("w%d", w)
				var epoch *int64
				if err := pool.QueryRow(dctx, "SELECT pgque.claim_slot($1, 'main', $2, $3)", pgqQueue, w, worker).Scan(&epoch); err != nil || epoch == nil {
					errs <- fmt.Errorf("claim_slot %d: %v (epoch %v)", w, err, epoch)
					cancel()
					return
				}
				for received.Load() < total && dctx.Err() == nil {
					rows, err := pool.Query(dctx, "SELECT payload FROM pgque.receive_partitioned($1, 'main', $2, $3, $4, 1000000)",
						pgqQueue, w, pgqSlots, worker)
					if err != nil {
						errs <- err
						cancel()
						return
					}
					n := 0
					for rows.Next() {
						var p []byte
						if err := rows.Scan(&p); err != nil {
							rows.Close()
							errs <- err
							cancel()
							return
						}
						n++
						k, j, ok := lcParse(p)
						if !ok || k >= lc.keys {
							violations.Add(1)
							continue
						}
						switch want := next[k].Load(); {
						case int32(j) == want:
							next[k].Store(want + 1)
						case int32(j) > want:
							violations.Add(1)
						}
					}
					rows.Close()
					if err := rows.Err(); err != nil {
						errs <- err
						cancel()
						return
					}
					if n == 0 {
						time.Sleep(2 * time.Millisecond) // no batch yet: the next tick makes one
						continue
					}
					if _, err := pool.Exec(dctx, "SELECT pgque.ack_partitioned($1, 'main', $2, $3, $4)", pgqQueue, w, pgqSlots, worker); err != nil {
						errs <- err
						cancel()
						return
					}
					if received.Add(int64(n)) >= total {
						cancel()
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
		}
		if n := received.Load(); n < total {
			return fmt.Errorf("%d of %d events within %s", n, total, lc.maxTime)
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("PgQue run %d drain: %w", run, err)
	}
	if v := violations.Load(); v > 0 {
		return out, fmt.Errorf("PgQue run %d drain: %d events out of per-key order", run, v)
	}
	out.Drain = drain
	fmt.Printf("PgQue run %d: load %s events/s (CPU per million: Go %.1f s, PostgreSQL %.1f s); drain %s events/s (Go %.1f s, PostgreSQL %.1f s); %d received, per-key order held\n",
		run, fmtInt(load.Rate), load.GoCPUPerM, load.PGCPUPerM, fmtInt(drain.Rate), drain.GoCPUPerM, drain.PGCPUPerM, received.Load())
	return out, nil
}
