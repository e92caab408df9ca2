// Command pushbench measures queen's push path and prints msgs/s and latency
// percentiles next to a single-row INSERT baseline measured in the same run.
//
// It starts its own PostgreSQL (fsync on) unless QUEEN_DATABASE_URL is set.
//
//	go run ./examples/pushbench                 # every scenario, 10s each
//	go run ./examples/pushbench -d 3s -only single
//	go run ./examples/pushbench -d 5s -only manykeys   # 100 keys vs 100,000 keys
//	go run ./examples/pushbench -d 5s -only keyed      # Item.Key over 100, 100,000 and 1,000,000 keys
//	go run ./examples/pushbench -only popready         # Pop latency, 100,000 partitions, few ready
//	go run ./examples/pushbench -only paced            # INSERT and push paced at 100/s against back to back
//	go run ./examples/pushbench -only acct             # server time and backend CPU per idle push, by kind
//	go run ./examples/pushbench -only stmtcpu          # the push statement's backend CPU, split into its parts
//	go run ./examples/pushbench -only split            # an idle push against its own statement run through pgx, and an INSERT
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

var (
	dur     = flag.Duration("d", 10*time.Second, "duration of each throughput scenario")
	only    = flag.String("only", "", "comma-separated scenarios to run: idle,single,batch,insert,manykeys,keyed,popready,paced (default all), acct, stmtcpu, split (only when named)")
	keys    = flag.Int("keys", 100_000, "keys (partitions) of the manykeys and popready scenarios")
	popN    = flag.Int("pop-n", 200, "measured pops in the popready scenario")
	fsync   = flag.Bool("fsync", true, "run the self-started cluster with fsync on")
	idleN   = flag.Int("idle-n", 2000, "sequential pushes in the idle latency scenario (and as many INSERTs)")
	pacedN  = flag.Int("paced-n", 1000, "measured calls of each kind and pacing in the paced scenario")
	conns   = flag.Int("conns", 0, "pool size for queen (0: queen's default)")
	acctN   = flag.Int("acct-n", 2000, "measured calls of each kind in the acct scenario")
	stmtN   = flag.Int("stmt-n", 10000, "measured calls of each kind in the stmtcpu scenario")
	cpuProf = flag.String("cpuprofile", "", "write a CPU profile of the push scenarios to this file")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func want(s string) bool {
	return *only == "" || slices.Contains(strings.Split(*only, ","), s)
}

// named reports whether s was named in -only.
func named(s string) bool { return slices.Contains(strings.Split(*only, ","), s) }

func run() error {
	ctx := context.Background()
	url := os.Getenv("QUEEN_DATABASE_URL")
	if url == "" {
		opts := pgcluster.Production()
		opts.Fsync = *fsync
		if named("acct") {
			opts.Settings["shared_preload_libraries"] = "pg_stat_statements"
			opts.Settings["pg_stat_statements.track"] = "all"
		}
		cl, err := pgcluster.Start(ctx, opts)
		if err != nil {
			return err
		}
		defer cl.Close()
		url = cl.URL
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 80
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var fs string
	_ = pool.QueryRow(ctx, "SHOW fsync").Scan(&fs)
	fmt.Printf("machine: %d CPUs, %s; PostgreSQL fsync=%s\n", runtime.NumCPU(), runtime.GOARCH, fs)
	fmt.Printf("%-44s %12s %10s %10s\n", "scenario", "msgs/s", "p50", "p99")

	qcfg := queen.Config{DatabaseURL: url, Schema: "pushbench"}
	if *conns > 0 {
		qpcfg, _ := pgxpool.ParseConfig(url)
		qpcfg.MaxConns = int32(*conns)
		qpool, err := pgxpool.NewWithConfig(ctx, qpcfg)
		if err != nil {
			return err
		}
		defer qpool.Close()
		qcfg = queen.Config{Pool: qpool, Schema: "pushbench"}
	}
	client, err := queen.Open(ctx, qcfg)
	if err != nil {
		return err
	}
	defer client.Close(ctx)
	payload := []byte(`{"event":"order.created","id":123456,"customer":"c-000042","items":[{"sku":"tea-01","qty":2},{"sku":"cup-07","qty":1}],"note":"leave at the door"}`)
	for len(payload) < 200 {
		payload = append(payload, ' ')
	}

	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if want("insert") || want("idle") {
		// The baseline and the idle pushes alternate in blocks of 100 calls
		// (which goes first swaps each round) on the client's own pool, so
		// both meet the same machine and connections: measured one after
		// the other, drift on a shared machine moved the ratio by a tenth
		// or more between runs.
		ipool := client.Pool()
		if _, err := ipool.Exec(ctx, "CREATE TABLE IF NOT EXISTS pushbench_rows (id bigserial, data bytea)"); err != nil {
			return err
		}
		insert := func() error {
			_, err := ipool.Exec(ctx, "INSERT INTO pushbench_rows (data) VALUES ($1)", payload)
			return err
		}
		q := client.Queue("idle")
		idle := func() error {
			_, err := q.Push(ctx, []queen.Item{{Data: payload}})
			return err
		}
		steps := []func() error{insert}
		if want("idle") {
			steps = append(steps, idle)
		}
		const block = 100
		lats := make([][]time.Duration, len(steps))
		for r := -1; r*block < *idleN; r++ { // round -1 is unmeasured: plans cached, pool warm
			for j := range steps {
				k := (j + max(r, 0)) % len(steps)
				for range block {
					t := time.Now()
					if err := steps[k](); err != nil {
						return err
					}
					if r >= 0 {
						lats[k] = append(lats[k], time.Since(t))
					}
				}
			}
		}
		report("baseline: single-row INSERT commit, 1 client", float64(len(lats[0]))/sum(lats[0]).Seconds(), lats[0])
		if want("idle") {
			lat := lats[1]
			report("idle: one push at a time", float64(len(lat))/sum(lat).Seconds(), lat)
			fmt.Printf("  idle push p50 / INSERT commit p50 = %.2f (alternating blocks of 100, same pool)\n",
				float64(pct(lat, 50))/float64(pct(lats[0], 50)))
		}
	}
	if want("insert") {
		rate, lat, err := load(64, func(_ int, _ int) error {
			_, err := pool.Exec(ctx, "INSERT INTO pushbench_rows (data) VALUES ($1)", payload)
			return err
		}, 1)
		if err != nil {
			return err
		}
		report("baseline: single-row INSERT commits, 64 conns", rate, lat)
	}
	if want("single") {
		q := client.Queue("single")
		before := client.Stats()
		rate, lat, err := load(1000, func(g, i int) error {
			_, err := q.Push(ctx, []queen.Item{{Data: payload, Partition: partName((g + i) % 100)}})
			return err
		}, 1)
		if err != nil {
			return err
		}
		report("single-item pushes, 1000 goroutines, 100 parts", rate, lat)
		printStats(before, client.Stats())
	}
	if want("batch") {
		q := client.Queue("batch")
		before := client.Stats()
		var pool sync.Pool
		rate, lat, err := load(8, func(g, i int) error {
			items, _ := pool.Get().(*[]queen.Item)
			if items == nil {
				s := make([]queen.Item, 1000)
				items = &s
			}
			part := partName(rand.IntN(100))
			for k := range *items {
				(*items)[k] = queen.Item{Data: payload, Partition: part}
			}
			_, err := q.Push(ctx, *items)
			pool.Put(items)
			return err
		}, 1000)
		if err != nil {
			return err
		}
		report("1000-item pushes (200 B), 8 goroutines", rate, lat)
		printStats(before, client.Stats())
	}
	if want("manykeys") {
		if err := manyKeys(ctx, client, payload); err != nil {
			return err
		}
	}
	if want("keyed") {
		if err := keyedLanes(ctx, client, payload); err != nil {
			return err
		}
	}
	if want("popready") {
		if err := popReady(ctx, client, payload); err != nil {
			return err
		}
	}
	if named("split") {
		if err := split(ctx, url, payload); err != nil {
			return err
		}
	}
	if named("stmtcpu") {
		if err := stmtCPU(ctx, url, payload); err != nil {
			return err
		}
	}
	if named("acct") {
		if err := acct(ctx, client, pool, payload); err != nil {
			return err
		}
	}
	if want("paced") {
		if err := paced(ctx, url, payload); err != nil {
			return err
		}
	}
	return nil
}

func partName(i int) string { return fmt.Sprintf("p%03d", i) }

// load runs fn from n goroutines for the configured duration and returns
// messages per second (each call counts per messages) and call latencies.
func load(n int, fn func(g, i int) error, per int) (float64, []time.Duration, error) {
	var (
		stop  atomic.Bool
		mu    sync.Mutex
		all   []time.Duration
		first error
		wg    sync.WaitGroup
		calls atomic.Int64
	)
	start := time.Now()
	for g := range n {
		wg.Go(func() {
			var lat []time.Duration
			for i := 0; !stop.Load(); i++ {
				t := time.Now()
				if err := fn(g, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				lat = append(lat, time.Since(t))
				calls.Add(1)
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	time.Sleep(*dur)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start)
	return float64(calls.Load()*int64(per)) / el.Seconds(), all, first
}

func printStats(a, b queen.Stats) {
	c, s, n := b.Commits-a.Commits, b.Segments-a.Segments, b.Items-a.Items
	if c == 0 {
		return
	}
	fmt.Printf("  commits %d, segments/commit %.1f, items/commit %.0f\n", c, float64(s)/float64(c), float64(n)/float64(c))
}

func report(name string, rate float64, lat []time.Duration) {
	fmt.Printf("%-44s %12.0f %10s %10s\n", name, rate, pct(lat, 50).Round(time.Microsecond), pct(lat, 99).Round(time.Microsecond))
}

func pct(lat []time.Duration, p int) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func sum(lat []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range lat {
		t += d
	}
	return t
}
