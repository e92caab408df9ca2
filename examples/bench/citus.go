//go:build unix

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
)

// The Citus workload: queen's push and drain scenarios on the distributed
// layout (Config.Citus) of existing Citus clusters whose nodes run on this
// machine (their CPU is read from /proc), one block per cluster in each
// round, so that clusters of one and two workers alternate:
//
//	PORT=9740 internal/citus/cluster.sh start /tmp/citus2           # two workers
//	PORT=9745 WORKERS=1 internal/citus/cluster.sh start /tmp/citus1 # one
//	go run . -citus-url URL2,URL1 -citus-rounds 2
var ct struct {
	urls   string
	rounds int
}

func init() {
	flag.StringVar(&ct.urls, "citus-url", "", "run only the Citus workload against these coordinators (comma-separated; their nodes on this machine): single, batch, mixed and drain on the distributed layout, a block per cluster in each round")
	flag.IntVar(&ct.rounds, "citus-rounds", 2, "Citus: rounds, each a block per cluster of -citus-url")
}

// ctNode is a node of a cluster: its name and the postmaster whose CPU it
// counts.
type ctNode struct {
	name       string
	host       string
	port       int
	postmaster int
	coord      bool
}

// ctRow is one scenario of one block. CPU is per million messages: the
// client's, the coordinator's, the workers' together and the busiest
// worker's (-1: unknown).
type ctRow struct {
	workers, round           int
	key                      string
	msgs                     int64
	secs, rate               float64
	goPerM, coordPerM        float64
	workersPerM, busiestPerM float64
	twoPC                    int64
	steal                    float64
	load                     string
}

type ctCluster struct {
	url      string
	base     *pgxpool.Pool
	nodes    []ctNode
	count2PC bool
}

func runCitus(ctx context.Context, cfg *config) error {
	var cls []*ctCluster
	for _, u := range strings.Split(ct.urls, ",") {
		base, err := pgxpool.New(ctx, u)
		if err != nil {
			return err
		}
		defer base.Close()
		nodes, err := ctNodes(ctx, base, u)
		if err != nil {
			return fmt.Errorf("%s: %w", u, err)
		}
		var iv, ver string
		_ = base.QueryRow(ctx, "SHOW citus.recover_2pc_interval").Scan(&iv)
		_ = base.QueryRow(ctx, "SELECT extversion FROM pg_extension WHERE extname = 'citus'").Scan(&ver)
		c := &ctCluster{url: u, base: base, nodes: nodes, count2PC: iv == "-1"}
		cls = append(cls, c)
		fmt.Printf("cluster %s: Citus %s, %d worker(s)", u, ver, len(nodes)-1)
		for _, n := range nodes {
			fmt.Printf("; %s :%d postmaster %d", n.name, n.port, n.postmaster)
		}
		if !c.count2PC {
			fmt.Printf("; citus.recover_2pc_interval is %s: two-phase commits not counted (cluster.sh sets -1)", iv)
		}
		fmt.Println()
	}
	cpuModel, mem := machine()
	fmt.Printf("machine: %d CPUs (%s), %.0f GiB; every node and the client on it\n", runtime.NumCPU(), cpuModel, mem)
	cond := startConditions("")
	fmt.Println()
	var rows []ctRow
	for round := 1; round <= ct.rounds; round++ {
		for _, c := range cls {
			rs, err := ctBlock(ctx, cfg, c, round)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, c.url, err)
			}
			rows = append(rows, rs...)
		}
	}
	fmt.Println()
	cond.end("")
	ctSummary(rows)
	return nil
}

// ctNodes lists the coordinator and the workers (by group) and finds each
// one's postmaster: the parent of a backend it starts for us.
func ctNodes(ctx context.Context, base *pgxpool.Pool, url string) ([]ctNode, error) {
	rows, err := base.Query(ctx, `SELECT nodename, nodeport, groupid = 0 FROM pg_dist_node
		WHERE isactive AND noderole = 'primary' ORDER BY groupid`)
	if err != nil {
		return nil, err
	}
	type hp struct {
		host  string
		port  int
		coord bool
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (hp, error) {
		var x hp
		err := r.Scan(&x.host, &x.port, &x.coord)
		return x, err
	})
	if err != nil {
		return nil, err
	}
	if len(list) < 2 || !list[0].coord {
		return nil, fmt.Errorf("want a coordinator in pg_dist_node (citus_set_coordinator_host) and workers, have %v", list)
	}
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	var out []ctNode
	for i, x := range list {
		c := cc.Copy()
		c.Host, c.Port = x.host, uint16(x.port)
		conn, err := pgx.ConnectConfig(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("node %s:%d: %w", x.host, x.port, err)
		}
		var pid int
		err = conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
		conn.Close(ctx)
		if err != nil {
			return nil, err
		}
		name := "coordinator"
		if !x.coord {
			name = fmt.Sprintf("worker%d", i)
		}
		out = append(out, ctNode{name: name, host: x.host, port: x.port, postmaster: parentOf(pid), coord: x.coord})
	}
	return out, nil
}

// parentOf is pid's parent from /proc (0: unknown).
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

// ctBlock runs the scenarios once on a fresh schema of cluster c.
func ctBlock(ctx context.Context, cfg *config, c *ctCluster, round int) ([]ctRow, error) {
	base, nodes := c.base, c.nodes
	w := len(nodes) - 1
	if _, err := base.Exec(ctx, "DROP SCHEMA IF EXISTS bench_queen CASCADE"); err != nil {
		return nil, err
	}
	qcfg := queen.Config{DatabaseURL: c.url, Schema: "bench_queen", Citus: true,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if !cfg.maintenance {
		qcfg.Maintenance.Interval = -1
	}
	client, err := queen.Open(ctx, qcfg)
	if err != nil {
		return nil, err
	}
	defer client.Close(context.Background())
	var placed []string
	rows, err := base.Query(ctx, `SELECT n.nodeport::text || ':' || count(*) FROM pg_dist_shard s
		JOIN pg_dist_placement pl ON pl.shardid = s.shardid JOIN pg_dist_node n ON n.groupid = pl.groupid
		WHERE s.logicalrelid = 'bench_queen.partitions'::regclass GROUP BY n.nodeport ORDER BY 1`)
	if err == nil {
		placed, _ = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	fmt.Printf("round %d, %d worker(s): shards of partitions by port %v; load average %s\n", round, w, placed, loadAvg())
	b := &bench{cfg: cfg, base: base, client: client, payloads: makePayloads(4096)}
	if err := ctWarm(ctx, client); err != nil {
		return nil, err
	}
	var out []ctRow
	for _, s := range []struct {
		key string
		fn  func(context.Context) (*result, error)
	}{{"single", b.queenSingle}, {"batch", b.queenBatch}, {"mixed", b.queenMixed}, {"drain", b.queenDrain}} {
		if !b.want(s.key) {
			continue
		}
		var tp0 int64
		if c.count2PC {
			tp0 = ctTwoPhase(ctx, base)
		}
		stat0, cpu0 := cpuStat(), cpuSeconds()
		meters := make([]*serverCPU, len(nodes))
		for i, n := range nodes {
			meters[i] = startServerCPU(n.postmaster)
		}
		r, err := s.fn(ctx)
		perNode := make([]float64, len(nodes))
		for i, m := range meters {
			perNode[i] = m.Stop()
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.key, err)
		}
		row := ctRow{workers: w, round: round, key: s.key, msgs: r.Msgs, secs: r.Seconds,
			steal: stealPct(stat0, cpuStat()), load: loadAvg(), twoPC: -1, coordPerM: -1, workersPerM: -1, busiestPerM: -1}
		if r.Msgs > 0 && r.Seconds > 0 {
			m := float64(r.Msgs) / 1e6
			r.Rate = float64(r.Msgs) / r.Seconds
			row.rate = r.Rate
			row.goPerM = (cpuSeconds() - cpu0) / m
			known := true
			var sum, most float64
			for i, c := range perNode {
				if c < 0 {
					known = false
					continue
				}
				if nodes[i].coord {
					row.coordPerM = c / m
				} else {
					sum += c
					most = max(most, c)
				}
			}
			if known {
				row.workersPerM, row.busiestPerM = sum/m, most/m
			}
		}
		if c.count2PC {
			row.twoPC = ctTwoPhase(ctx, base) - tp0
		}
		out = append(out, row)
		printRow(r)
		fmt.Printf("  CPU s per 1M msgs: client %.0f, coordinator %.0f, workers %.0f (busiest %.0f); steal %.1f%%, load %s",
			row.goPerM, row.coordPerM, row.workersPerM, row.busiestPerM, row.steal, row.load)
		if row.twoPC >= 0 {
			fmt.Printf("; two-phase commits %d (%.1f per 100,000 msgs)", row.twoPC, 1e5*float64(row.twoPC)/float64(max(row.msgs, 1)))
		}
		fmt.Println()
	}
	return out, nil
}

// ctWarm makes what the scenarios would do first, outside their clocks:
// each queue and partition (a queue's row and a partition's first push
// write reference tables or take their locks on every node: two-phase
// commits) and the drain group's first contact (its subscription), so
// that the figures, two-phase commits included, are the hot path's. It
// leaves one message in each partition of "batch" but the claimed one.
func ctWarm(ctx context.Context, client *queen.Client) error {
	for _, qn := range []string{"single", "batch", "mixed"} {
		var items []queen.Item
		for _, p := range partNames(narrowParts) {
			items = append(items, queen.Item{Partition: p, Data: []byte("warm")})
		}
		if err := checkPush(client.Queue(qn).Push(ctx, items)); err != nil {
			return fmt.Errorf("warm-up push to %s: %w", qn, err)
		}
	}
	_, err := client.Queue("batch").Pop(ctx, queen.PopOptions{AutoAck: true})
	return err
}

// ctTwoPhase counts the two-phase commits recorded on the coordinator (one
// row per worker of each; exact while background recovery is off).
func ctTwoPhase(ctx context.Context, base *pgxpool.Pool) int64 {
	var n int64
	_ = base.QueryRow(ctx, `SELECT count(DISTINCT regexp_replace(gid, '_[0-9]+$', '')) FROM pg_dist_transaction`).Scan(&n)
	return n
}

// ctSummary prints, per scenario and worker count, each block's rate and
// the medians, as a Markdown table.
func ctSummary(rows []ctRow) {
	var keys []string
	var ws []int
	for _, r := range rows {
		if !slices.Contains(keys, r.key) {
			keys = append(keys, r.key)
		}
		if !slices.Contains(ws, r.workers) {
			ws = append(ws, r.workers)
		}
	}
	slices.Sort(ws)
	fmt.Println()
	fmt.Println("| scenario | workers | msgs/s per block | median msgs/s | CPU s / 1M msgs: client | coordinator | workers | busiest worker | 2PC per 100k msgs | steal per block |")
	fmt.Println("|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
	for _, k := range keys {
		for _, w := range ws {
			var rates, gos, coord, wk, busy []float64
			var each, steals []string
			var tp, msgs int64
			counted := true
			for _, r := range rows {
				if r.key != k || r.workers != w || r.rate == 0 {
					continue
				}
				rates = append(rates, r.rate)
				each = append(each, fmtInt(r.rate))
				steals = append(steals, fmt.Sprintf("%.0f%%", r.steal))
				gos, coord, wk, busy = append(gos, r.goPerM), append(coord, r.coordPerM), append(wk, r.workersPerM), append(busy, r.busiestPerM)
				counted = counted && r.twoPC >= 0
				tp += r.twoPC
				msgs += r.msgs
			}
			if len(rates) == 0 {
				continue
			}
			tpc := "n/a"
			if counted {
				tpc = fmt.Sprintf("%.1f", 1e5*float64(tp)/float64(max(msgs, 1)))
			}
			fmt.Printf("| %s | %d | %s | %s | %.0f | %.0f | %.0f | %.0f | %s | %s |\n", k, w, strings.Join(each, ", "), fmtInt(median(rates)),
				median(gos), median(coord), median(wk), median(busy), tpc, strings.Join(steals, ", "))
		}
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
