//go:build unix

// Command bench measures queen side by side with COPY, single-row INSERT
// commits, River (v0.51.2) and PgQ (the pgq 3 extension and pgqd, when
// installed) in one run, against one PostgreSQL, and prints a table, writes
// the results as JSON and draws a PNG bar chart. Each run first prints what
// it ran on (CPUs, load average, an fdatasync probe) and, before the
// figures, the CPU steal over the run and the probe again.
//
// It is its own Go module so that the library gains no dependency on River.
// It starts a throwaway PostgreSQL from the installed server binaries (fsync
// on, synchronous_commit on unless -sync-commit=off) unless -url or
// QUEEN_DATABASE_URL names an existing database (it then creates and drops
// the schemas bench_queen, bench_base and bench_river, and the database
// bench_pgq, in it).
//
//	cd examples/bench
//	go run . -quick                  # about 2 minutes
//	go run .                         # the full run, about 10-15 minutes
//	go run . -only single,batch -cpuprofile /tmp/cpu.pprof
//	go run . -citus-url URL2,URL1    # on Citus, two workers vs one (citus.go)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// Scenario keys, in run order.
var allScenarios = []string{
	"single", "insert", "insert-one", "insert-paced", "pgq-single", "batch", "copy", "mixed", "copy-one", "river-insert", "pgq-batch", "wide",
	"drain", "river-drain", "pgq-drain", "e2e", "river-e2e", "pgq-e2e",
}

type config struct {
	quick       bool
	url         string
	syncCommit  string
	only        string
	nSingle     int
	nBatch      int
	nWide       int
	nDrain      int
	maxTime     time.Duration
	e2e         string
	e2eCases    []e2eCase
	e2eDur      time.Duration
	concurrency int
	popParts    int
	batchParts  int
	riverWork   int
	riverFetch  time.Duration
	riverE2EFC  time.Duration
	queenConns  int
	out         string
	cpuProfile  string
	pgStat      bool
	maintenance bool
}

func parseFlags() *config {
	c := &config{}
	flag.BoolVar(&c.quick, "quick", false, "small counts and short caps: the whole run fits in about 2 minutes")
	flag.StringVar(&c.url, "url", "", "use this existing database instead of starting one (default $QUEEN_DATABASE_URL)")
	flag.StringVar(&c.syncCommit, "sync-commit", "on", "synchronous_commit for every connection: on or off")
	flag.StringVar(&c.only, "only", "", "comma-separated scenarios to run (default all): "+strings.Join(allScenarios, ","))
	flag.IntVar(&c.nSingle, "n-single", 0, "messages for the single-item push scenario and the single-row INSERT baseline (default 1,000,000; quick 100,000)")
	flag.IntVar(&c.nBatch, "n", 0, "messages for the 1000-item push scenario, COPY and River InsertMany (default 3,000,000; quick 1,000,000)")
	flag.IntVar(&c.nWide, "n-wide", 0, "messages for the 1000-item pushes over 100,000 partitions (default 2,000,000; quick 300,000)")
	flag.IntVar(&c.nDrain, "n-drain", 0, "messages drained by queen Consume and by River workers (default 1,000,000; quick 200,000)")
	flag.DurationVar(&c.maxTime, "max-time", 0, "cap on each load scenario; a capped scenario reports what it did (default 90s; quick 12s)")
	flag.StringVar(&c.e2e, "e2e", "100:1:1:1,2000:100:16:100,10000:100:16:100",
		"end-to-end scenarios (queen and River at each offered rate), comma-separated rate:partitions:concurrency:batch; partitions, concurrency and batch are queen's")
	flag.DurationVar(&c.e2eDur, "e2e-time", 0, "duration of each end-to-end scenario (default 30s; quick 6s)")
	flag.IntVar(&c.concurrency, "consume-concurrency", 4, "queen ConsumeOptions.Concurrency in the drain scenario")
	flag.IntVar(&c.popParts, "consume-partitions", 1, "PopOptions.Partitions (partitions claimed per pop) in the drain scenario")
	flag.IntVar(&c.batchParts, "batch-partitions", narrowParts, "partitions of the 1000-item push scenario, whose backlog the drain consumes (1: a single-partition drain)")
	flag.IntVar(&c.riverWork, "river-workers", 200, "River MaxWorkers for the drain and end-to-end scenarios")
	flag.DurationVar(&c.riverFetch, "river-fetch-cooldown", time.Millisecond, "River FetchCooldown for the drain scenario (River's default is 100ms, which caps a drain at MaxWorkers×10 jobs/s)")
	flag.DurationVar(&c.riverE2EFC, "river-e2e-fetch-cooldown", 10*time.Millisecond,
		"River FetchCooldown for the end-to-end scenarios (River's default is 100ms; in a sweep at 2,000 msgs/s, 10ms gave the lowest latency, and 1ms and 100ms fell behind)")
	flag.IntVar(&c.queenConns, "queen-conns", 0, "queen's pool size (0: queen's own pool with pgx's default size)")
	flag.StringVar(&c.out, "out", "results", "directory for bench.json and bench.png (empty: write nothing)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of each scenario run to this file, with the scenario's name inserted before the extension")
	flag.BoolVar(&c.maintenance, "maintenance", true, "run queen's background maintenance loop (false: Config.Maintenance.Interval = -1, for A/B comparisons)")
	flag.BoolVar(&c.pgStat, "pgstat", false, "self-started cluster only: load pg_stat_statements and print each scenario's top server-side statements")
	flag.Parse()
	def := func(p *int, full, quick int) {
		if *p == 0 {
			*p = full
			if c.quick {
				*p = quick
			}
		}
	}
	def(&c.nSingle, 1_000_000, 100_000)
	def(&c.nBatch, 3_000_000, 1_000_000)
	def(&c.nWide, 2_000_000, 300_000)
	def(&c.nDrain, 1_000_000, 200_000)
	if c.maxTime == 0 {
		c.maxTime = 90 * time.Second
		if c.quick {
			c.maxTime = 12 * time.Second
		}
	}
	if c.e2eDur == 0 {
		c.e2eDur = 30 * time.Second
		if c.quick {
			c.e2eDur = 6 * time.Second
		}
	}
	if c.url == "" {
		c.url = os.Getenv("QUEEN_DATABASE_URL")
	}
	return c
}

func main() {
	cfg := parseFlags()
	var err error
	if cfg.e2eCases, err = parseE2E(cfg.e2e); err != nil {
		log.Fatal(err)
	}
	if cfg.batchParts < 1 {
		log.Fatalf("-batch-partitions must be at least 1, not %d", cfg.batchParts)
	}
	if cfg.syncCommit != "on" && cfg.syncCommit != "off" {
		log.Fatalf("-sync-commit must be on or off, not %q", cfg.syncCommit)
	}
	for _, s := range strings.Split(cfg.only, ",") {
		if s != "" && !slices.Contains(allScenarios, s) {
			log.Fatalf("-only: unknown scenario %q (have %s)", s, strings.Join(allScenarios, ","))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if kc.child != "" { // a consumer process of the keyconsume workload
		if err := runKeyConsumeChild(ctx); err != nil {
			log.Fatal(err)
		}
		return
	}
	if kc.on { // the per-key parallel Consume workload runs on its own (keyconsume.go)
		if err := runKeyConsume(ctx, cfg); err != nil {
			log.Fatal(err)
		}
		return
	}
	if ct.urls != "" { // the Citus workload runs on its own (citus.go)
		if err := runCitus(ctx, cfg); err != nil {
			log.Fatal(err)
		}
		return
	}
	if lc.on { // the lifecycle workload runs on its own (lifecycle.go)
		if err := runLifecycle(ctx, cfg); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(ctx, cfg); err != nil {
		log.Fatal(err)
	}
}

// bench holds what every scenario shares.
type bench struct {
	cfg        *config
	base       *pgxpool.Pool // baselines and bookkeeping
	client     *queen.Client
	postmaster int
	payloads   [][]byte
	results    []*result
	meta       meta
	// Messages available for the drain scenarios.
	queenBacklog int64
	riverBacklog int64
	pgqBacklog   int64
	// PgQ's database (pgq.go), opened by its first scenario.
	pgq        *pgxpool.Pool
	pgqVersion string
	// dataDir is the cluster's data directory, "" when unknown: the
	// fdatasync probe runs on its filesystem.
	dataDir string
}

type meta struct {
	Command    string            `json:"command"`
	Date       string            `json:"date"`
	CPUs       int               `json:"cpus"`
	CPUModel   string            `json:"cpu_model"`
	MemGiB     float64           `json:"mem_gib"`
	GoVersion  string            `json:"go_version"`
	PostgreSQL string            `json:"postgresql"`
	Settings   map[string]string `json:"settings"`
	Server     string            `json:"server"`
	Flags      map[string]string `json:"flags"`
	// LoadAvg is /proc/loadavg at the start and the end: the machine is
	// shared, and other work on it shows up here.
	LoadAvgStart string  `json:"loadavg_start"`
	LoadAvgEnd   string  `json:"loadavg_end"`
	WallSeconds  float64 `json:"wall_seconds"`
	// Conditions: CPU steal over the run and an fdatasync probe at its
	// start and end (conditions.go).
	Conditions *conditions `json:"conditions"`
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}

func run(ctx context.Context, cfg *config) error {
	b := &bench{cfg: cfg, payloads: makePayloads(4096)}
	b.meta = meta{
		Command:   "go run . " + strings.Join(os.Args[1:], " "),
		Date:      time.Now().UTC().Format(time.RFC3339),
		CPUs:      runtime.NumCPU(),
		GoVersion: runtime.Version(),
		Flags:     map[string]string{},
	}
	b.meta.CPUModel, b.meta.MemGiB = machine()
	b.meta.LoadAvgStart = loadAvg()
	t0 := time.Now()
	flag.VisitAll(func(f *flag.Flag) { b.meta.Flags[f.Name] = f.Value.String() })

	url := cfg.url
	if url == "" && (b.want("pgq-batch") || b.want("pgq-single") || b.want("pgq-drain") || b.want("pgq-e2e")) {
		ensurePgQ(ctx) // before the cluster starts: apt-get must not run beside a cluster of the bench
	}
	if url == "" {
		// A production-like server: fsync, full_page_writes and
		// synchronous_commit on, shared_buffers 512MB, wal_buffers 16MB,
		// max_wal_size 4GB, min_wal_size 512MB, checkpoint_timeout 15min.
		opts := pgcluster.Production()
		opts.Settings["synchronous_commit"] = cfg.syncCommit
		opts.Settings["max_connections"] = "300"
		if cfg.pgStat {
			opts.Settings["shared_preload_libraries"] = "pg_stat_statements"
			opts.Settings["pg_stat_statements.track"] = "all"
		}
		fmt.Println("starting PostgreSQL (production-like profile, fsync on) ...")
		cl, err := pgcluster.Start(ctx, opts)
		if err != nil {
			return err
		}
		defer cl.Close()
		url = cl.URL
		b.postmaster = cl.Pid()
		b.dataDir = cl.DataDir
		b.meta.Server = "self-started throwaway cluster on 127.0.0.1"
	} else {
		b.meta.Server = "existing database (-url / QUEEN_DATABASE_URL)"
		if cfg.pgStat {
			return errors.New("-pgstat needs the self-started cluster")
		}
	}
	if cfg.syncCommit == "off" {
		// Per connection as well, so it also holds against an existing server.
		url = withParam(url, "synchronous_commit", "off")
	}

	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 72
	if b.base, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return err
	}
	defer b.base.Close()
	if err := b.base.Ping(ctx); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	b.meta.Settings = map[string]string{}
	for _, s := range []string{"server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "wal_buffers", "wal_level", "max_wal_size", "min_wal_size", "checkpoint_timeout"} {
		var v string
		if err := b.base.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err == nil {
			b.meta.Settings[s] = v
		}
	}
	_ = b.base.QueryRow(ctx, "SELECT version()").Scan(&b.meta.PostgreSQL)
	if b.dataDir == "" {
		_ = b.base.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&b.dataDir)
	}
	if cfg.pgStat {
		if _, err := b.base.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return err
		}
	}
	for _, s := range []string{"bench_queen", "bench_base", "bench_river"} {
		if _, err := b.base.Exec(ctx, "DROP SCHEMA IF EXISTS "+s+" CASCADE"); err != nil {
			return err
		}
	}

	qcfg := queen.Config{DatabaseURL: url, Schema: "bench_queen", Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if !cfg.maintenance {
		qcfg.Maintenance.Interval = -1
	}
	if cfg.queenConns > 0 {
		qp, err := pgxpool.ParseConfig(url)
		if err != nil {
			return err
		}
		qp.MaxConns = int32(cfg.queenConns)
		pool, err := pgxpool.NewWithConfig(ctx, qp)
		if err != nil {
			return err
		}
		defer pool.Close()
		qcfg.DatabaseURL, qcfg.Pool = "", pool
	}
	if b.client, err = queen.Open(ctx, qcfg); err != nil {
		return err
	}
	defer b.client.Close(context.Background())

	fmt.Printf("machine: %d CPUs (%s), %.0f GiB; %s\n", b.meta.CPUs, b.meta.CPUModel, b.meta.MemGiB, b.meta.PostgreSQL)
	fmt.Printf("fsync=%s synchronous_commit=%s full_page_writes=%s; %s\n",
		b.meta.Settings["fsync"], b.meta.Settings["synchronous_commit"], b.meta.Settings["full_page_writes"], b.meta.Server)
	b.meta.Conditions = startConditions(b.dataDir)
	fmt.Println()
	defer func() {
		if b.pgq != nil {
			b.pgq.Close()
		}
	}()

	steps := map[string]func(context.Context) (*result, error){
		"single":       b.queenSingle,
		"insert":       b.insertBaseline,
		"insert-one":   b.insertOne,
		"insert-paced": b.insertPaced,
		"batch":        b.queenBatch,
		"copy":         b.copyBaseline,
		"mixed":        b.queenMixed,
		"copy-one":     b.copyOne,
		"river-insert": b.riverInsert,
		"wide":         b.queenWide,
		"drain":        b.queenDrain,
		"river-drain":  b.riverDrain,
	}
	type step struct {
		key string
		fn  func(context.Context) (*result, error)
		// prep runs before fn, outside its clock and CPU accounting.
		prep func(context.Context) error
	}
	var plan []step
	for _, key := range allScenarios {
		switch {
		case key == "e2e":
			// Each offered rate: queen, then River beside it.
			for _, c := range cfg.e2eCases {
				if b.want("e2e") {
					plan = append(plan, step{fmt.Sprintf("e2e-%d", c.rate), b.queenE2E(c), nil})
				}
				if b.want("river-e2e") {
					plan = append(plan, step{fmt.Sprintf("river-e2e-%d", c.rate), b.riverE2E(c), nil})
				}
			}
		case key == "river-e2e":
		case key == "pgq-batch":
			if b.want(key) {
				plan = append(plan, step{"pgq-copy", b.pgqBatchCopy, b.pgqPrep}, step{"pgq-insert-batch", b.pgqBatchInsert, b.pgqPrep})
			}
		case key == "pgq-e2e":
			if b.want(key) {
				for _, c := range pgqE2ECases {
					plan = append(plan, step{c.key, b.pgqE2E(c), b.pgqPrep})
				}
			}
		case key == "pgq-single":
			if b.want(key) {
				plan = append(plan, step{key, b.pgqSingle, b.pgqPrep})
			}
		case key == "pgq-drain":
			if b.want(key) {
				plan = append(plan, step{key, b.pgqDrain, b.pgqDrainLoad})
			}
		case b.want(key):
			plan = append(plan, step{key, steps[key], nil})
		}
	}
	for _, s := range plan {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if s.prep != nil {
			if err := s.prep(ctx); err != nil {
				return fmt.Errorf("scenario %s: %w", s.key, err)
			}
		}
		r, err := b.measure(ctx, s.key, s.fn)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", s.key, err)
		}
		b.results = append(b.results, r)
		printRow(r)
	}
	b.meta.LoadAvgEnd = loadAvg()
	b.meta.WallSeconds = time.Since(t0).Seconds()
	fmt.Println()
	b.meta.Conditions.end(b.dataDir)
	fmt.Printf("wall time %.0fs\n\n", b.meta.WallSeconds)
	printTable(os.Stdout, b.results)
	fmt.Println()
	printRatios(os.Stdout, b.results)
	fmt.Println()
	printE2E(os.Stdout, b.results)
	if cfg.out != "" {
		if err := b.write(cfg.out); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) want(key string) bool {
	return b.cfg.only == "" || slices.Contains(strings.Split(b.cfg.only, ","), key)
}

// measure runs one scenario with its CPU, RSS and (optionally) profile
// bookkeeping around it.
func (b *bench) measure(ctx context.Context, key string, fn func(context.Context) (*result, error)) (*result, error) {
	if b.cfg.pgStat {
		_, _ = b.base.Exec(ctx, "SELECT pg_stat_statements_reset()")
	}
	resetPeakRSS()
	if b.cfg.cpuProfile != "" {
		ext := filepath.Ext(b.cfg.cpuProfile)
		name := strings.TrimSuffix(b.cfg.cpuProfile, ext) + "." + key + ext
		f, err := os.Create(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	cpu0, pg := cpuSeconds(), startServerCPU(b.postmaster)
	r, err := fn(ctx)
	pgCPU := pg.Stop()
	if err != nil {
		return nil, err
	}
	cpu1 := cpuSeconds()
	r.Key = key
	r.PeakRSSMiB, _ = rssMB()
	if r.Msgs > 0 && r.Seconds > 0 {
		r.Rate = float64(r.Msgs) / r.Seconds
		m := float64(r.Msgs) / 1e6
		r.GoCPU = cpu1 - cpu0
		r.GoCPUPerM = r.GoCPU / m
		r.PGCPU, r.PGCPUPerM = -1, -1
		if pgCPU >= 0 {
			r.PGCPU = pgCPU
			r.PGCPUPerM = pgCPU / m
		}
	}
	if b.cfg.pgStat {
		printTopStatements(ctx, b.base)
	}
	return r, nil
}

// printTopStatements prints the statements with the most server time since
// the last pg_stat_statements_reset().
func printTopStatements(ctx context.Context, base *pgxpool.Pool) {
	rows, err := base.Query(ctx, `SELECT calls, total_exec_time, rows, regexp_replace(left(query, 150), '\s+', ' ', 'g')
		FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 24`)
	if err != nil {
		fmt.Println("  pg_stat_statements:", err)
		return
	}
	defer rows.Close()
	fmt.Println("  top statements (pg_stat_statements, track=all; nested ones are counted inside their callers too):")
	for rows.Next() {
		var calls, n int64
		var total float64
		var q string
		if err := rows.Scan(&calls, &total, &n, &q); err == nil {
			fmt.Printf("    %9.0f ms %8d calls %10d rows  %s\n", total, calls, n, q)
		}
	}
}

func (b *bench) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(struct {
		Meta    meta      `json:"meta"`
		Results []*result `json:"results"`
		Ratios  []ratio   `json:"ratios"`
	}{b.meta, b.results, ratios(b.results)}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	title := fmt.Sprintf("queen vs baselines, msgs/s - %d vCPU %s, PostgreSQL %s, fsync=%s synchronous_commit=%s",
		b.meta.CPUs, b.meta.CPUModel, b.meta.Settings["server_version"], b.meta.Settings["fsync"], b.meta.Settings["synchronous_commit"])
	sub := fmt.Sprintf("%s  (%s, %s)", b.meta.Command, b.meta.Date, b.meta.GoVersion)
	if err := writeChart(filepath.Join(dir, "bench.png"), title, sub, b.results); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s and %s\n", filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.png"))
	return nil
}

// machine reads the CPU model and memory size from /proc.
func machine() (string, float64) {
	model := runtime.GOARCH
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	var mem float64
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %f kB", &kb); err == nil {
			mem = kb / (1 << 20)
		}
	}
	return model, mem
}

func withParam(url, k, v string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	if !strings.Contains(url, "://") {
		return url + " " + k + "=" + v // key=value DSN
	}
	return url + sep + k + "=" + v
}
