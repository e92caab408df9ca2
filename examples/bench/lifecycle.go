//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// The lifecycle workload: per-key event streams (an order's created, paid,
// shipped, ... events), one partition per key. keys × 10 events of 200
// bytes are loaded by 8 loaders pushing 1000 events per call, then drained
// by 16 Consume workers with per-key order checked. Run with -lifecycle; it
// starts its own PostgreSQL with production-like settings (or uses -url)
// and runs on its own, not with the other scenarios.
var lc struct {
	on         bool
	pgStat     *pgxpool.Pool // set with -pgstat: print each phase's top statements
	keys       int
	events     int
	runs       int
	lag        int
	maxTime    time.Duration
	partitions int
	lanes      bool
	pgque      string // PgQue's single-file install, to run it beside queen
	profile    string // -cpuprofile: each queen load and drain is profiled to it, the phase inserted before the extension
}

func init() {
	flag.BoolVar(&lc.on, "lifecycle", false, "run only the lifecycle workload (keys × events, partition per key, 8 loaders, 16 workers, per-key order checked)")
	flag.IntVar(&lc.keys, "lifecycle-keys", 100_000, "lifecycle: keys (one partition each)")
	flag.IntVar(&lc.events, "lifecycle-events", 10, "lifecycle: events per key")
	flag.IntVar(&lc.runs, "lifecycle-runs", 5, "lifecycle: load + drain runs, each on a fresh schema")
	flag.IntVar(&lc.lag, "lifecycle-lag", 500_000, "lifecycle: after the runs, one more with a second group lagging by this many messages (0: skip)")
	flag.BoolVar(&lc.lanes, "lifecycle-lanes", false, "lifecycle: keyed lanes (Item.Key, the queue's 64 lanes) instead of a partition per key; the drain also checks that no two handlers of a key overlap")
	flag.StringVar(&lc.pgque, "lifecycle-pgque", "", "lifecycle: also run the workload through PgQue, installed from this file (devel/sql/pgque.sql of a PgQue checkout; 16 partition-key slots, 16 workers, ticker every 10 ms), each run a pair with queen in alternating order")
	flag.IntVar(&lc.partitions, "lifecycle-partitions", 8, "lifecycle: the drain's PopOptions.Partitions (batches claimed ahead per worker)")
	flag.DurationVar(&lc.maxTime, "lifecycle-max-time", 10*time.Minute, "lifecycle: cap on each load and each drain")
}

const (
	lcLoaders = 8
	lcWorkers = 16
	lcCall    = 1000
)

// lcSettings are added to the production-like profile for the workload.
var lcSettings = map[string]string{
	"max_connections": "200",
}

type lcPhase struct {
	Msgs      int64   `json:"messages"`
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"msgs_per_sec"`
	GoCPUPerM float64 `json:"go_cpu_s_per_million"`
	PGCPUPerM float64 `json:"pg_cpu_s_per_million"` // -1: not measured
}

type lcRun struct {
	Run      int     `json:"run"`
	Load     lcPhase `json:"load"`
	Drain    lcPhase `json:"drain"`
	LagGroup int64   `json:"lagging_group_behind,omitempty"`
}

func runLifecycle(ctx context.Context, cfg *config) error {
	url, postmaster, dataDir := cfg.url, 0, ""
	if url == "" {
		fmt.Println("starting PostgreSQL (production-like profile: fsync on, shared_buffers 512MB, wal_buffers 16MB, max_wal_size 4GB, checkpoint_timeout 15min) ...")
		opts := pgcluster.Production()
		maps.Copy(opts.Settings, lcSettings)
		if cfg.pgStat {
			opts.Settings["shared_preload_libraries"] = "pg_stat_statements"
			opts.Settings["pg_stat_statements.track"] = "all"
		}
		cl, err := pgcluster.Start(ctx, opts)
		if err != nil {
			return err
		}
		defer cl.Close()
		url, postmaster, dataDir = cl.URL, cl.Pid(), cl.DataDir
	}
	base, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer base.Close()
	var version string
	if err := base.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if cfg.pgStat {
		if _, err := base.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return err
		}
		lc.pgStat = base
	}
	if dataDir == "" {
		_ = base.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dataDir)
	}
	lc.profile = cfg.cpuProfile
	cond := startConditions(dataDir)
	total := int64(lc.keys) * int64(lc.events)
	fmt.Printf("lifecycle: %d keys × %d events of %d bytes, %d loaders × %d events per call, %d workers; PostgreSQL %s\n",
		lc.keys, lc.events, payloadSize, lcLoaders, lcCall, lcWorkers, version)
	// With PgQue, each run is a pair whose order alternates (queen first,
	// then PgQue first, ...): the machine's drift and whatever one side
	// leaves behind (dead rows, a checkpoint) fall on both sides alike.
	var runs, pgqRuns []lcRun
	for r := 1; r <= lc.runs; r++ {
		pgqFirst := lc.pgque != "" && r%2 == 0
		if pgqFirst {
			run, err := pgqOnce(ctx, base, url, postmaster, r)
			if err != nil {
				return err
			}
			pgqRuns = append(pgqRuns, run)
		}
		run, err := lcOnce(ctx, base, url, postmaster, r, 0)
		if err != nil {
			return err
		}
		runs = append(runs, run)
		if lc.pgque != "" && !pgqFirst {
			run, err := pgqOnce(ctx, base, url, postmaster, r)
			if err != nil {
				return err
			}
			pgqRuns = append(pgqRuns, run)
		}
	}
	if lc.lag > 0 && int64(lc.lag) < total {
		run, err := lcOnce(ctx, base, url, postmaster, len(runs)+1, int64(lc.lag))
		if err != nil {
			return err
		}
		runs = append(runs, run)
	}
	cond.end(dataDir)
	lcSummary(runs)
	if len(pgqRuns) > 0 {
		fmt.Println("PgQue:")
		lcSummary(pgqRuns)
		lcPairs(runs, pgqRuns)
	}
	if cfg.out != "" {
		if err := os.MkdirAll(cfg.out, 0o755); err != nil {
			return err
		}
		data, err := json.MarshalIndent(map[string]any{
			"keys": lc.keys, "events": lc.events, "payload_bytes": payloadSize, "loaders": lcLoaders,
			"events_per_call": lcCall, "workers": lcWorkers, "settings": lcSettings, "postgresql": version,
			"date": time.Now().UTC().Format(time.RFC3339), "runs": runs, "pgque_runs": pgqRuns, "conditions": cond,
		}, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(cfg.out, "lifecycle.json"), data, 0o644)
	}
	return nil
}

// lcOnce loads and drains once on a fresh schema. With lag > 0 a second
// group subscribes before the load and consumes total - lag messages before
// the measured drain, so it is lag messages behind while the first drains.
func lcOnce(ctx context.Context, base *pgxpool.Pool, url string, postmaster, run int, lag int64) (lcRun, error) {
	out := lcRun{Run: run, LagGroup: lag}
	schema := "bench_lifecycle_" + strconv.Itoa(run)
	if _, err := base.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return out, err
	}
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: schema,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return out, err
	}
	defer func() {
		_ = c.Close(context.Background())
		_, _ = base.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	}()
	q := c.Queue("lifecycle")
	total := int64(lc.keys) * int64(lc.events)
	if lag > 0 {
		if err := q.Configure(ctx, queen.QueueOptions{}); err != nil {
			return out, err
		}
		if _, err := q.Pop(ctx, queen.PopOptions{Group: "lagging", AutoAck: true}); err != nil {
			return out, err
		}
	}

	// Load: loader l owns the keys k ≡ l (mod 8) and pushes event j of all
	// of them before event j+1, 1000 events per call, so each key's events
	// are pushed in order by one loader.
	keys := partNames(lc.keys)
	var pushed atomic.Int64
	stopProfile, err := lcProfile("load", run)
	if err != nil {
		return out, err
	}
	load, err := lcMeasure(postmaster, total, func() error {
		defer stopProfile()
		lctx, cancel := context.WithTimeout(ctx, lc.maxTime)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, lcLoaders)
		for l := range lcLoaders {
			wg.Go(func() {
				items := make([]queen.Item, 0, lcCall)
				flush := func() bool {
					res, err := q.Push(lctx, items)
					if err == nil {
						err = checkPush(res, nil)
					}
					if err != nil {
						errs <- err
						return false
					}
					pushed.Add(int64(len(items)))
					items = items[:0]
					return true
				}
				for j := range lc.events {
					for k := l; k < lc.keys; k += lcLoaders {
						it := queen.Item{Partition: keys[k], Data: lcPayload(k, j)}
						if lc.lanes {
							it = queen.Item{Key: keys[k], Data: lcPayload(k, j)}
						}
						items = append(items, it)
						if len(items) == lcCall && !flush() {
							return
						}
					}
				}
				if len(items) > 0 {
					flush()
				}
			})
		}
		wg.Wait()
		close(errs)
		return <-errs
	})
	if err != nil {
		return out, fmt.Errorf("run %d load: %w (%d of %d pushed)", run, err, pushed.Load(), total)
	}
	out.Load = load

	if lag > 0 {
		if _, err := lcDrain(ctx, q, "lagging", total-lag, nil); err != nil {
			return out, fmt.Errorf("run %d, lagging group: %w", run, err)
		}
	}

	// Drain: 16 workers; event j of a key must follow event j-1.
	next := make([]atomic.Int32, lc.keys)
	busy := make([]atomic.Bool, lc.keys)
	var overlaps atomic.Int64
	var violations atomic.Int64
	var handled int64
	stopProfile, err = lcProfile("drain", run)
	if err != nil {
		return out, err
	}
	drain, err := lcMeasure(postmaster, total, func() error {
		defer stopProfile()
		var err error
		handled, err = lcDrain(ctx, q, "main", total, func(m *queen.Message) {
			k, j, ok := lcParse(m.Data)
			if !ok || k >= lc.keys {
				violations.Add(1)
				return
			}
			// Exclusion: no other handler of this key may be running.
			if !busy[k].CompareAndSwap(false, true) {
				overlaps.Add(1)
			} else {
				defer busy[k].Store(false)
			}
			if lc.lanes && m.Key != keys[k] {
				violations.Add(1)
			}
			switch want := next[k].Load(); {
			case int32(j) == want:
				next[k].Store(want + 1)
			case int32(j) > want:
				violations.Add(1)
			}
		})
		return err
	})
	if err != nil {
		return out, fmt.Errorf("run %d drain: %w", run, err)
	}
	if v := violations.Load(); v > 0 {
		return out, fmt.Errorf("run %d drain: %d messages out of per-key order", run, v)
	}
	if v := overlaps.Load(); v > 0 {
		return out, fmt.Errorf("run %d drain: %d times two handlers of one key ran at once", run, v)
	}
	out.Drain = drain
	note := ""
	if lag > 0 {
		note = fmt.Sprintf(", a second group %d messages behind", lag)
	}
	fmt.Printf("run %d: load %s msgs/s (CPU per million: Go %.1f s, PostgreSQL %.1f s); drain %s msgs/s (Go %.1f s, PostgreSQL %.1f s)%s; %d handled, per-key order and exclusion held\n",
		run, fmtInt(load.Rate), load.GoCPUPerM, load.PGCPUPerM, fmtInt(drain.Rate), drain.GoCPUPerM, drain.PGCPUPerM, note, handled)
	return out, nil
}

// lcDrain consumes group's messages of q with 16 workers until want of them
// were handled for the first time in per-key order (fn, if set, sees every
// delivery), and returns how many deliveries there were.
func lcDrain(ctx context.Context, q *queen.Queue, group string, want int64, fn func(*queen.Message)) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, lc.maxTime)
	defer cancel()
	var handled atomic.Int64
	// When the drain passed 50, 90 and 99% of want: a slow drain with a
	// long tail differs from one that is slow throughout.
	start := time.Now()
	var marks [3]atomic.Int64
	err := q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: group, Batch: 1000, Partitions: lc.partitions}, Concurrency: lcWorkers},
		func(_ context.Context, m *queen.Message) error {
			if fn != nil {
				fn(m)
			}
			n := handled.Add(1)
			for i, f := range []int64{50, 90, 99} {
				if n == want*f/100 {
					marks[i].Store(int64(time.Since(start)))
				}
			}
			if n == want {
				cancel()
			}
			return nil
		})
	fmt.Printf("  drain of %s: 50%% at %s, 90%% at %s, 99%% at %s, all at %s\n", group,
		time.Duration(marks[0].Load()).Round(time.Millisecond), time.Duration(marks[1].Load()).Round(time.Millisecond),
		time.Duration(marks[2].Load()).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if err != nil && !errors.Is(err, context.Canceled) {
		return handled.Load(), err
	}
	if n := handled.Load(); n < want {
		return n, fmt.Errorf("%d of %d messages within %s", n, want, lc.maxTime)
	}
	return handled.Load(), ctx.Err()
}

// lcProfile starts a CPU profile of one phase of run when -cpuprofile is
// set, and returns what stops it.
func lcProfile(phase string, run int) (func(), error) {
	if lc.profile == "" {
		return func() {}, nil
	}
	ext := filepath.Ext(lc.profile)
	f, err := os.Create(fmt.Sprintf("%s.lifecycle-%s-%d%s", strings.TrimSuffix(lc.profile, ext), phase, run, ext))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		// The allocations since the program started, sampled: for the
		// first run's load, about that load's.
		if a, err := os.Create(fmt.Sprintf("%s.lifecycle-%s-%d.allocs%s", strings.TrimSuffix(lc.profile, ext), phase, run, ext)); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(a, 0)
			a.Close()
		}
	}, nil
}

// lcMeasure runs fn and returns its rate over msgs and CPU per million.
func lcMeasure(postmaster int, msgs int64, fn func() error) (lcPhase, error) {
	if lc.pgStat != nil {
		_, _ = lc.pgStat.Exec(context.Background(), "SELECT pg_stat_statements_reset()")
		defer printTopStatements(context.Background(), lc.pgStat)
	}
	cpu0, pg := cpuSeconds(), startServerCPU(postmaster)
	start := time.Now()
	err := fn()
	el := time.Since(start)
	pgCPU := pg.Stop()
	goCPU := cpuSeconds() - cpu0
	m := float64(msgs) / 1e6
	p := lcPhase{Msgs: msgs, Seconds: el.Seconds(), Rate: float64(msgs) / el.Seconds(), GoCPUPerM: goCPU / m, PGCPUPerM: -1}
	if pgCPU >= 0 {
		p.PGCPUPerM = pgCPU / m
	}
	return p, err
}

// lcPayload is event j of key k: "k<key> e<event> " then padding to 200 bytes.
func lcPayload(k, j int) []byte {
	b := make([]byte, payloadSize)
	n := copy(b, fmt.Sprintf(`{"key":%d,"event":%d,"type":"order.lifecycle","note":"`, k, j))
	for i := n; i < payloadSize-2; i++ {
		b[i] = 'x'
	}
	copy(b[payloadSize-2:], `"}`)
	return b
}

func lcParse(b []byte) (k, j int, ok bool) {
	var v struct {
		Key   int `json:"key"`
		Event int `json:"event"`
	}
	if json.Unmarshal(b, &v) != nil {
		return 0, 0, false
	}
	return v.Key, v.Event, true
}

// lcPairs prints queen against PgQue run by run (each pair ran back to
// back, in alternating order): the load and drain rates' ratios and the
// load's CPU a message, PgQue's over queen's (above 1: queen spends less).
func lcPairs(runs, pgqRuns []lcRun) {
	fmt.Println("queen against PgQue, pair by pair (queen first in odd pairs, PgQue first in even ones):")
	var loads []float64
	for i, r := range runs {
		if r.LagGroup > 0 || i >= len(pgqRuns) {
			continue
		}
		p := pgqRuns[i]
		cpu := "-"
		if r.Load.PGCPUPerM >= 0 && p.Load.PGCPUPerM >= 0 {
			cpu = fmt.Sprintf("%.2f", (p.Load.GoCPUPerM+p.Load.PGCPUPerM)/(r.Load.GoCPUPerM+r.Load.PGCPUPerM))
		}
		fmt.Printf("  pair %d: load %.2f× PgQue's rate (CPU a message, PgQue's / queen's: %s); drain %.2f×\n",
			r.Run, r.Load.Rate/p.Load.Rate, cpu, r.Drain.Rate/p.Drain.Rate)
		loads = append(loads, r.Load.Rate/p.Load.Rate)
	}
	if len(loads) > 0 {
		fmt.Printf("  load ratio over %d pairs: min %.2f×, median %.2f×, max %.2f×\n",
			len(loads), slices.Min(loads), median(loads), slices.Max(loads))
	}
}

func lcSummary(runs []lcRun) {
	var load, drain []float64
	for _, r := range runs {
		if r.LagGroup == 0 {
			load, drain = append(load, r.Load.Rate), append(drain, r.Drain.Rate)
		}
	}
	spread := func(v []float64) string {
		if len(v) == 0 {
			return "-"
		}
		lo, hi := slices.Min(v), slices.Max(v)
		return fmt.Sprintf("%s-%s msgs/s (max/min %.2f)", fmtInt(lo), fmtInt(hi), hi/lo)
	}
	fmt.Printf("\nlifecycle summary over %d runs: load %s; drain %s\n", len(load), spread(load), spread(drain))
	for _, r := range runs {
		if r.LagGroup > 0 && len(drain) > 0 {
			slices.Sort(drain)
			med := drain[len(drain)/2]
			fmt.Printf("with a second group %d messages behind: drain %s msgs/s, %+.1f%% against the median %s msgs/s\n",
				r.LagGroup, fmtInt(r.Drain.Rate), 100*(r.Drain.Rate-med)/med, fmtInt(med))
		}
	}
}
