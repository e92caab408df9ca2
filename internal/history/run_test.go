package history_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/zeebo/xxh3"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/history"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

var (
	flagSeed     = flag.Uint64("seed", 0, "history: run this one seed (default: the CI seeds)")
	flagDuration = flag.Duration("duration", 0, "history: how long each seed generates operations (default 8s)")
	flagChildren = flag.Int("children", 0, "history: child processes (default 1)")
)

// ciSeeds run in CI; each is a different draw of knobs, operations and
// faults. Interleavings are not reproducible (real PostgreSQL, real
// scheduler): a seed fixes the choices, not the timing.
var ciSeeds = []uint64{1, 2, 3}

const (
	defaultDuration  = 8 * time.Second
	statementTimeout = 2 * time.Second
)

// TestHistory drives clients in this process and in child processes against
// one schema with injected faults, then checks the recorded history against
// the final log (see package history). Soak: go test ./internal/history
// -run 'TestHistory$' -seed N -duration 30m.
func TestHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("history checker")
	}
	seeds, dur, children := ciSeeds, defaultDuration, 1
	if *flagSeed != 0 {
		seeds = []uint64{*flagSeed}
	}
	if *flagDuration != 0 {
		dur = *flagDuration
	}
	if *flagChildren != 0 {
		children = *flagChildren
	}
	cl := pgtest.NewCluster(t, pgcluster.Options{Settings: map[string]string{"max_connections": "200"}})
	// The design's bounds on one call's cost, judged on a wide queue of its
	// own (bounds_test.go).
	t.Run("bounds", func(t *testing.T) { runBounds(t, cl) })
	if *flagSeed == 0 {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
				(&run{t: t, seed: seed, cl: cl, dur: dur, children: children}).main()
			})
		}
		// A run too short for most groups to pop: the final drain is their
		// first contact and must join each with its own subscription.
		t.Run("short", func(t *testing.T) {
			(&run{t: t, seed: 1, cl: cl, dur: 300 * time.Millisecond, children: children}).main()
		})
		return
	}
	// A soak: rounds of at most soakRound on fresh schemas (bounded memory
	// and database size), seeds derived from the given one.
	var total runStats
	for round := uint64(0); total.elapsed < dur; round++ {
		d := min(dur-total.elapsed, soakRound)
		seed := *flagSeed*1000 + round
		start := time.Now()
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			st := (&run{t: t, seed: seed, cl: cl, dur: d, children: children}).main()
			total.ops += st.ops
			total.faults += st.faults
			total.deliveries += st.deliveries
			total.violations += st.violations
		})
		total.elapsed += time.Since(start)
	}
	fmt.Printf("history: %d ops, %d faults, %d deliveries, %d violations\n", total.ops, total.faults, total.deliveries, total.violations)
}

// soakRound bounds one round of a soak.
const soakRound = 2 * time.Minute

type runStats struct {
	ops, faults, deliveries, violations int
	elapsed                             time.Duration
}

// Queues of a run. Every one is audited; each has a dedup window longer
// than any run, so a transaction id is stored at most once.
type queueSpec struct {
	name string
	opts queen.QueueOptions
}

// A failed message waits its retry backoff before coming back: short ones
// here, so a run of seconds still sees failures redelivered (the final
// drain still reads every waiting one: nothing lost); "pause" waits
// 0.5-2 s; "skip" keeps the default, 1-2 s for its one retry (its copy
// waits aside under FailureSkip), and "secret" too, which never waits (a
// RetryLimit of 1 dead-letters).
var queueSpecs = []queueSpec{
	{"pause", queen.QueueOptions{DedupWindow: time.Hour, RetryLimit: 2, DeadLetter: true,
		RetryBackoff: queen.RetryBackoff{Min: 500 * time.Millisecond, Max: 2 * time.Second}}},
	{"skip", queen.QueueOptions{DedupWindow: time.Hour, RetryLimit: 2, DeadLetter: true, FailurePolicy: queen.FailureSkip}},
	{"secret", queen.QueueOptions{DedupWindow: time.Hour, RetryLimit: 1, DeadLetter: true, Encryption: true}},
	// Retention takes messages whether read or not; CompletedRetention
	// those every group read.
	{"retained", queen.QueueOptions{DedupWindow: time.Hour, RetryLimit: 2, DeadLetter: true, Retention: 4 * time.Second,
		RetryBackoff: shortBackoff}},
	// CompletedRetention alone: only what every group read may go.
	{"completed", queen.QueueOptions{DedupWindow: time.Hour, RetryLimit: 2, DeadLetter: true, CompletedRetention: 500 * time.Millisecond,
		RetryBackoff: shortBackoff}},
	// No dedup window: a Buffered item's replay is the only guard against
	// storing it twice.
	{"nodedup", queen.QueueOptions{RetryLimit: 2, DeadLetter: true, RetryBackoff: shortBackoff}},
	// Deleted now and then by the "delete" generator (and recreated with
	// the defaults by a push racing the Configure that follows): no dedup
	// window, as a recreated queue has none.
	{"doomed", queen.QueueOptions{RetryLimit: 2, DeadLetter: true}},
}

// shortBackoff is the retry backoff of most run queues.
var shortBackoff = queen.RetryBackoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}

// groups read everything; lateGroups join with SubscribeNew at their first
// pop, which a worker makes some time into the run.
var (
	groups     = []string{"", "g1", "g2"}
	lateGroups = []string{"gnew"}
	// fromGroup joins with SubscribeFrom(the run's start + fromDelay).
	fromGroup = "gfrom"
)

const fromDelay = 2 * time.Second

// secretMarker starts every payload pushed to the encrypted queue: it must
// never appear on disk, in the database or in a spool file.
const secretMarker = "secret-payload:"

func payload(q, tx string) []byte {
	if q == "secret" {
		return []byte(secretMarker + tx)
	}
	return []byte("payload:" + tx)
}

type run struct {
	// maintMu: every generator's maintenance window holds it shared,
	// staleflag's round alone, so no other window's end (which turns the
	// mode off for all) excuses what that round must judge.
	maintMu sync.RWMutex
	t       *testing.T
	seed    uint64
	cl      *pgcluster.Cluster
	// workers: a Citus coordinator's worker nodes (cl is the
	// coordinator); the nemesis stops and restarts them too.
	workers []*pgcluster.Cluster
	// citus: the clients set Config.Citus (the distributed layout).
	citus    bool
	dur      time.Duration
	children int
	from     time.Time // the SubscribeFrom group's start

	schema string
	key    []byte
	rec    *history.Recorder
	dir    string

	faults     atomic.Int64
	workerDown atomic.Int64 // "stop-worker" faults injected
	restarts   atomic.Int64 // "restart" faults injected (the coordinator's, on Citus)
	kindsMu    sync.Mutex
	kinds      map[string]int // faults injected, by kind
	destroyMu  sync.Mutex
	destroyed  []history.Stored // messages of segments the nemesis corrupted
	plaintext  atomic.Int64     // plaintext-at-rest findings
	plainFiles sync.Map         // spool files reported, each once
	childFiles []string
	spoolDirs  []string

	gen   gens
	key2  []byte // the key rotated to mid-run ("keyrot")
	fresh atomic.Int64
	bg    sync.WaitGroup // first pushes the nemesis started
	sw    *spoolWin      // "spoolwin", nil when off

	extraMu sync.Mutex
	extra   map[string]history.QueueInfo // queues made during the run
	extraQ  []string
	storms  []string // groups the storm made on "completed"
	obs     observed // gen_observe_test.go
}

// addQueue audits a queue made during the run.
func (r *run) addQueue(q string, qi history.QueueInfo) {
	r.extraMu.Lock()
	defer r.extraMu.Unlock()
	if r.extra == nil {
		r.extra = map[string]history.QueueInfo{}
	}
	r.extra[q] = qi
	r.extraQ = append(r.extraQ, q)
}

func (r *run) addStormGroup() string {
	r.extraMu.Lock()
	defer r.extraMu.Unlock()
	g := fmt.Sprintf("storm%d", len(r.storms))
	r.storms = append(r.storms, g)
	return g
}

func (r *run) stormGroups() []string {
	r.extraMu.Lock()
	defer r.extraMu.Unlock()
	return slices.Clone(r.storms)
}

func (r *run) main() (st runStats) {
	t := r.t
	rng := rand.New(rand.NewPCG(r.seed, 0x6869))
	var err error
	r.schema = fmt.Sprintf("hist_%d_%d", r.seed, time.Now().UnixNano()%1e9)
	r.key = make([]byte, 32)
	for i := range r.key {
		r.key[i] = byte(rng.IntN(256))
	}
	if r.gen, err = parseGens(*flagGen); err != nil {
		t.Fatal(err)
	}
	if r.gen["keyrot"] {
		// Every process can read the next key from the start; one client
		// encrypts with it from mid-run on.
		r.key2 = make([]byte, 32)
		for i := range r.key2 {
			r.key2[i] = byte(rng.IntN(256))
		}
	}
	if r.gen["misuse"] {
		r.schema = longSchema(r.schema, r.seed) // odd seeds: a 63-byte name
	}
	t.Logf("generators: %s", r.gen)
	r.dir, err = os.MkdirTemp("", "queen-history-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if !t.Failed() {
			os.RemoveAll(r.dir)
		}
	}()
	f, err := os.Create(filepath.Join(r.dir, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r.rec = history.NewRecorder(f, true)
	// The heal, the final drain and Close come after the run: at load 25-30
	// they took more than three minutes, and a round that ends on this
	// bound gives no verdict. On the distributed layout a drain's pop is
	// several round trips a partition: at load 20-27 the drain of seed 3's
	// ~450 groups of fresh queues took more than seven minutes, and seed
	// 4's drains outlived 20 at load 10-18.
	bound := 8 * time.Minute
	if r.citus {
		bound = 35 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.dur+bound)
	defer cancel()

	setupStart := time.Now()
	admin := r.open(ctx, "admin", t.TempDir())
	for _, qs := range queueSpecs {
		o := qs.opts
		o.LeaseTime = time.Duration(300+rng.IntN(1700)) * time.Millisecond
		if err := admin.Queue(qs.name).Configure(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	r.from = time.Now().Add(min(fromDelay, r.dur/3))
	// The run's duration counts from the end of setup (below): under load,
	// opening the clients takes seconds, and generators started last would
	// otherwise get no time of a short seed.
	genCtx, stopGen := newGenContext(ctx, r.dur) // gendeadline_test.go
	defer stopGen()
	var wg sync.WaitGroup
	var clients []*queen.Client
	for i := range 2 {
		dir := t.TempDir()
		r.spoolDirs = append(r.spoolDirs, dir)
		cfg := r.config(fmt.Sprintf("main-%d", i), dir)
		cfg.MeterProvider = r.meterProvider(fmt.Sprintf("main-%d", i)) // read by recordMetrics
		c := r.openCfg(ctx, cfg)
		clients = append(clients, c)
	}
	for i, c := range clients {
		for w := range 3 {
			wk := &worker{c: c, rec: r.rec, proc: fmt.Sprintf("main-%d", i), idx: w, rng: rand.New(rand.NewPCG(r.seed, uint64(i*16+w+1))), from: r.from,
				gen: r.gen, r: r, other: clients[1-i]}
			wg.Go(func() { wk.loop(genCtx) })
		}
	}
	if r.gen["autoorder"] { // first: its backlog takes most of the run to drain
		wg.Go(func() { r.autoOrders(genCtx, clients[1]) })
	}
	if r.gen["seedrows"] { // early: its queue and connections are made during setup
		wg.Go(func() { r.seedRows(genCtx, clients) }) // gen_seedrows_test.go
	}
	var others []*queen.Client // closed at heal
	rot := make(chan *queen.Client, 1)
	if r.gen["keyrot"] {
		// Rotated: the new key encrypts, the old one still decrypts.
		dir := t.TempDir()
		r.spoolDirs = append(r.spoolDirs, dir)
		cfg := r.config("rot-0", dir)
		cfg.EncryptionKey, cfg.DecryptionKeys = r.key2, [][]byte{r.key}
		wg.Go(func() {
			select {
			case <-genCtx.Done():
				return
			case <-time.After(r.dur / 2):
			}
			c, err := queen.Open(ctx, cfg)
			if err != nil {
				return
			}
			rot <- c
			var wg2 sync.WaitGroup
			for w := range 2 {
				wk := &worker{c: c, rec: r.rec, proc: "rot-0", idx: w, rng: rand.New(rand.NewPCG(r.seed, uint64(100+w))), from: r.from, gen: r.gen}
				wg2.Go(func() { wk.loop(genCtx) })
			}
			wg2.Wait()
		})
	}
	var nokey *queen.Client
	if r.gen["wrongkey"] || r.gen["firstpush"] {
		dir := t.TempDir()
		r.spoolDirs = append(r.spoolDirs, dir)
		cfg := r.config("nokey", dir)
		cfg.EncryptionKey, cfg.DecryptionKeys = nil, nil
		nokey = r.openCfg(ctx, cfg)
		others = append(others, nokey)
	}
	if r.gen["wrongkey"] {
		dir := t.TempDir()
		r.spoolDirs = append(r.spoolDirs, dir)
		cfg := r.config("wrongkey", dir)
		cfg.EncryptionKey, cfg.DecryptionKeys = make([]byte, 32), nil
		for i := range cfg.EncryptionKey {
			cfg.EncryptionKey[i] = byte(rng.IntN(256))
		}
		wrong := r.openCfg(ctx, cfg)
		others = append(others, wrong)
		wrng := rand.New(rand.NewPCG(r.seed, 0x77))
		wg.Go(func() { r.wrongKeyLoop(genCtx, []*queen.Client{wrong, nokey}, []string{"wrongkey", "nokey"}, wrng) })
	}
	if r.gen["faults"] {
		// A client of its own: its pops are recorded as "faults", and the
		// main clients' metrics must count only what their procs did.
		dir := t.TempDir()
		r.spoolDirs = append(r.spoolDirs, dir)
		fc := r.open(ctx, "faults", dir)
		others = append(others, fc)
		r.startFaults(genCtx, ctx, &wg, fc, admin) // gen_faults_test.go; before scanSpools reads spoolDirs
	}
	if r.gen["spoolwin"] {
		r.sw = r.openSpoolWin(ctx, genCtx, admin)
		others = append(others, r.sw.c)
	}
	if r.gen["revive"] { // gen_revive_test.go; before scanSpools reads spoolDirs
		rv := r.openRevive(ctx)
		others = append(others, rv.c)
		wg.Go(func() { rv.loop(genCtx) })
	}
	if r.gen["staleflag"] { // gen_maintstale_test.go; before scanSpools reads spoolDirs
		ms := r.openMaintStale(ctx)
		others = append(others, ms.c)
		wg.Go(func() { ms.loop(genCtx) })
	}
	var cc *queen.Client
	if r.gen["contact"] {
		// A client of its own (stall takes every connection of a main
		// client now and then), opened before scanSpools reads spoolDirs.
		dir := t.TempDir()
		r.spoolDirs = append(r.spoolDirs, dir)
		cc = r.open(ctx, "contact", dir)
		others = append(others, cc)
	}
	var kb *queen.Client
	if r.gen["keyback"] {
		// A client of its own: the main clients' pools are shared by every
		// worker, and its Consumes must keep claiming for held to judge.
		dir := t.TempDir()
		r.spoolDirs = append(r.spoolDirs, dir)
		kb = r.open(ctx, "keyback", dir)
		others = append(others, kb)
	}
	var fz *queen.Client
	freezeTP := &freezeTracer{}
	if r.gen["freeze"] {
		dir := t.TempDir() // before scanSpools reads spoolDirs
		r.spoolDirs = append(r.spoolDirs, dir)
		cfg := r.config("freeze", dir)
		cfg.TracerProvider = freezeTP
		fz = r.openCfg(ctx, cfg)
		others = append(others, fz)
	}
	var oc *queen.Client
	if r.gen["offsets"] {
		// A client of its own (before scanSpools reads spoolDirs): the main
		// clients' metrics count only what their procs did.
		dir := t.TempDir()
		r.spoolDirs = append(r.spoolDirs, dir)
		oc = r.open(ctx, offsetsProc, dir)
		others = append(others, oc)
	}
	ch := make([]*child, r.children)
	for i := range ch {
		ch[i] = &child{r: r, idx: i, spool: t.TempDir()}
		r.spoolDirs = append(r.spoolDirs, ch[i].spool)
		ch[i].start()
	}
	wg.Go(func() { r.scanSpools(genCtx) })
	wg.Go(func() { r.observe(genCtx, clients[0], "main-0") })
	nem := &nemesis{r: r, admin: admin, clients: clients, children: ch, rng: rand.New(rand.NewPCG(r.seed, 0xfa17)), nokey: nokey}
	wg.Go(func() { nem.loop(genCtx) })
	if r.gen["storm"] {
		// Three at once: a round is a few calls, slow on a loaded machine.
		for i := range 3 {
			c := clients[i%len(clients)]
			wg.Go(func() { nem.seedRaces(genCtx, c, rand.New(rand.NewPCG(r.seed, 0x5eed+uint64(i)))) })
		}
	}
	if r.gen["delete"] {
		// A fourth worker of main-0 (its own transaction ids) racing Deletes
		// with pushes all run long: a worker's own Deletes are a few a seed.
		rw := &worker{c: clients[0], rec: r.rec, proc: "main-0", idx: 3, rng: rand.New(rand.NewPCG(r.seed, 0xde1e7e)), from: r.from,
			gen: r.gen, r: r, other: clients[1]}
		wg.Go(func() { rw.deleteRaces(genCtx) })
	}
	if r.gen["contact"] {
		cw := &worker{c: cc, rec: r.rec, proc: "contact", idx: 0, rng: rand.New(rand.NewPCG(r.seed, 0xc0)), from: r.from,
			gen: r.gen, r: r, other: clients[0]}
		wg.Go(func() { cw.contactRaces(genCtx) })
	}
	if r.gen["autostop"] {
		aw := &worker{c: clients[0], rec: r.rec, proc: "main-0", idx: 4, rng: rand.New(rand.NewPCG(r.seed, 0xa5)), from: r.from,
			gen: r.gen, r: r, other: clients[1]}
		wg.Go(func() { aw.autoStops(genCtx) })
	}
	if r.gen["stall"] {
		sw := &worker{c: clients[1], rec: r.rec, proc: "main-1", idx: 3, rng: rand.New(rand.NewPCG(r.seed, 0x57a11)), from: r.from,
			gen: r.gen, r: r, other: clients[0]}
		wg.Go(func() {
			for genCtx.Err() == nil {
				sw.stall(genCtx)
				select { // a stall spooled in an outage returns at once
				case <-genCtx.Done():
				case <-time.After(300 * time.Millisecond):
				}
			}
		})
	}
	if r.gen["freeze"] {
		fw := &worker{c: fz, rec: r.rec, proc: "freeze", idx: 0, rng: rand.New(rand.NewPCG(r.seed, 0xf5ee5e)), from: r.from,
			gen: r.gen, r: r, other: clients[0]}
		wg.Go(func() {
			for genCtx.Err() == nil {
				fw.freeze(genCtx, freezeTP)
				select {
				case <-genCtx.Done():
				case <-time.After(300 * time.Millisecond):
				}
			}
		})
	}
	if r.gen["offsets"] {
		wg.Go(func() { r.offsets(genCtx, oc) }) // gen_offsets_test.go
	}
	r.startSched(genCtx, &wg, clients, time.Now().Add(r.dur)) // gen_sched_test.go
	r.startKeyBack(genCtx, &wg, kb)                           // gen_keyback_test.go
	genTimer := genCtx.arm(stopGen)
	defer genTimer.Stop()
	t.Logf("setup took %v; generating for %v", time.Since(setupStart).Round(time.Millisecond), r.dur)
	wg.Wait()
	r.bg.Wait()
	if r.sw != nil {
		t.Logf("spoolwin: %d maintenance windows", r.sw.n)
	}
	select {
	case c := <-rot:
		others = append(others, c)
	default:
	}

	// Heal: the server up, maintenance off, children stopped, every spool
	// drained by a client on it.
	for _, c := range ch {
		c.kill()
	}
	r.heal(ctx, admin)
	for _, c := range others {
		if c != nil {
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			_ = c.Close(cctx)
			ccancel()
		}
	}
	for _, c := range clients {
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		if err := c.Close(cctx); err != nil {
			t.Logf("close: %v", err)
		}
		ccancel()
	}
	// The procs that use a client drawn at random or another proc's: storm, seedRaces, outage, cursorSeeds.
	r.recordMetrics(ctx, []string{"storm", "seedrace", "main-x", "cseed"})
	for i, dir := range r.spoolDirs {
		c := r.open(ctx, fmt.Sprintf("drain-%d", i), dir)
		deadline := time.Now().Add(90 * time.Second)
		for c.SpoolStats().PendingRecords > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("spool %s not drained: %+v", dir, c.SpoolStats())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	drainStart := time.Now()
	deliveries := r.finalDrain(ctx, admin)
	t.Logf("final drain: %d deliveries in %s", deliveries, time.Since(drainStart).Round(time.Second))

	events := r.rec.Events()
	for _, p := range r.childFiles {
		evs, err := history.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // killed before it opened its history
		}
		if err != nil {
			t.Fatalf("child history %s: %v", p, err)
		}
		events = append(events, evs...)
	}
	hs := history.State{Queues: map[string]history.QueueInfo{}, Log: r.readLog(ctx, admin)}
	// A corruption whose write did not apply left its messages in the log.
	inLog := map[string]bool{}
	for _, s := range hs.Log {
		inLog[fmt.Sprint(s.Queue, "/", s.Partition, "@", s.Offset)] = true
	}
	for _, d := range r.destroyed {
		if !inLog[fmt.Sprint(d.Queue, "/", d.Partition, "@", d.Offset)] {
			hs.Destroyed = append(hs.Destroyed, d)
		}
	}
	starts := r.logStarts(ctx, admin)
	for _, qs := range queueSpecs {
		qi := history.QueueInfo{Deduped: qs.opts.DedupWindow > 0, Groups: groups, LateGroups: lateGroups,
			FromGroups: map[string]int64{fromGroup: r.from.UnixNano()},
			// A deleted queue is recreated with the defaults: no dead letters.
			DeadLetter: qs.opts.DeadLetter && qs.name != "doomed", Encrypted: qs.opts.Encryption, RetryMin: retryMinOf(qs.name, qs.opts)}
		switch {
		case qs.opts.Retention > 0:
			qi.Retained, qi.LogStart = true, starts[qs.name]
		case qs.opts.CompletedRetention > 0:
			qi.Completed = true
			qi.Groups = append(slices.Clone(groups), r.stormGroups()...)
		}
		hs.Queues[qs.name] = qi
	}
	for q, qi := range r.extra {
		hs.Queues[q] = qi
	}
	hs.DeadLetters = r.readDeadLetters(ctx, admin)
	hs.Orphans = r.readOrphans(ctx, admin)
	r.checkSecretLog(ctx, admin)
	vs := history.Check(events, hs, 0)
	shown := map[string]int{}
	for _, v := range vs {
		// Eight of a kind per queue: one queue's flood must not hide another's.
		k := v.Kind + "\x00" + v.Queue
		if shown[k]++; shown[k] > 8 {
			continue
		}
		t.Errorf("seed %d: %s", r.seed, v)
		if v.Partition != "" {
			r.dumpPartition(ctx, admin, v)
			r.dumpLog(hs.Log, v)
		}
	}
	ops := len(history.Pair(events))
	line := fmt.Sprintf("history: %d ops, %d faults, %d deliveries, %d violations", ops, r.faults.Load(), deliveries+countDeliveries(events), len(vs)+int(r.plaintext.Load()))
	if len(vs) > 0 {
		t.Logf("seed %d: history kept in %s (timing is not reproducible; rerun the seed)", r.seed, r.dir)
	}
	t.Log(line)
	r.kindsMu.Lock()
	t.Logf("faults by kind: %v", r.kinds)
	r.kindsMu.Unlock()
	if err := admin.Close(ctx); err != nil {
		t.Error(err)
	}
	return runStats{ops: ops, faults: int(r.faults.Load()), deliveries: deliveries + countDeliveries(events), violations: len(vs) + int(r.plaintext.Load())}
}

func countDeliveries(evs []history.Event) int {
	n := 0
	for _, e := range evs {
		if e.Phase == history.OK && e.Op == history.OpPop {
			n += len(e.Msgs)
		}
		if e.Phase == history.Invoke && e.Op == history.OpHandler {
			n++
		}
	}
	return n
}

func (r *run) url() string { return r.cl.URL }

func (r *run) open(ctx context.Context, name, spool string) *queen.Client {
	return r.openCfg(ctx, r.config(name, spool))
}

func (r *run) openCfg(ctx context.Context, cfg queen.Config) *queen.Client {
	r.t.Helper()
	var c *queen.Client
	var err error
	for range 50 { // the server may be restarting
		c, err = queen.Open(ctx, cfg)
		if err == nil {
			return c
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Fatalf("open %s: %v", cfg.SpoolDir, err)
	return nil
}

func (r *run) config(name, spool string) queen.Config {
	cfg := queen.Config{DatabaseURL: r.url(), Schema: r.schema, SpoolDir: spool, EncryptionKey: r.key,
		StatementTimeout: statementTimeout, Logger: slog.New(&claimLog{rec: r.rec, proc: name}), Citus: r.citus}
	if r.key2 != nil {
		cfg.DecryptionKeys = [][]byte{r.key2}
	}
	return cfg
}

// claimLog is a client's log: it records each batch a Consume claimed (the
// client's Debug line) as an OpClaim of proc and drops everything else.
type claimLog struct {
	rec  *history.Recorder
	proc string
}

// loggedCalls are the log lines recorded as calls of kind, with the error
// they carry and, where said, their queue and partition.
var loggedCalls = []struct {
	prefix, kind     string
	queue, partition bool
}{
	// The settle failures Consume only logs: the checker looks for text the
	// database refused.
	{"queen: consume: settle failed", "settle-log", true, true},
	{"queen: consume: writing out-of-order settlements failed", "settle-log", true, true},
	// The push marks them itself, in the caller's transaction: first keyed
	// pushes in opposite orders may then deadlock.
	{"queen: marking queues keyed ahead of a push failed", "mark-failed", false, false},
	// A claim of unknown outcome: with AutoAck it may have consumed its
	// batch unseen.
	{"queen: consume: claim failed", "claim-error", true, false},
}

func (*claimLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *claimLog) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h *claimLog) WithGroup(string) slog.Handler          { return h }

func (h *claimLog) Handle(_ context.Context, r slog.Record) error {
	for _, l := range loggedCalls {
		if !strings.HasPrefix(r.Message, l.prefix) {
			continue
		}
		ev := history.Event{Proc: h.proc, Op: history.OpCall, Kind: l.kind}
		var errText string
		r.Attrs(func(a slog.Attr) bool {
			switch {
			case a.Key == "err":
				errText = a.Value.String()
			case a.Key == "queue" && l.queue:
				ev.Queue = a.Value.String()
			case a.Key == "partition" && l.partition:
				ev.Partition = a.Value.String()
			}
			return true
		})
		h.rec.Done(h.rec.Invoke(ev), history.OK, history.Event{Err: errText})
		return nil
	}
	if r.Message != "queen: consume claimed" {
		return nil
	}
	ev := history.Event{Proc: h.proc, Op: history.OpClaim}
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "queue":
			ev.Queue = a.Value.String()
		case "group":
			ev.Group = a.Value.String()
		case "partition":
			ev.Partition = a.Value.String()
		case "first":
			ev.Offset = a.Value.Int64()
		case "last":
			ev.Last = a.Value.Int64()
		case "messages":
			ev.Batch = int(a.Value.Int64())
		case "lease":
			ev.Lease = a.Value.String()
		}
		return true
	})
	h.rec.Done(h.rec.Invoke(ev), history.OK, history.Event{})
	return nil
}

func (r *run) heal(ctx context.Context, admin *queen.Client) {
	_ = r.cl.Start(ctx) // in case a restart failed half-way; "already running" is the usual answer
	for {
		err := admin.SetMaintenance(ctx, false)
		for _, qs := range queueSpecs {
			if err == nil {
				o := qs.opts // DelayedProcessing back to 0, a lease the drain can outwait
				o.LeaseTime = time.Second
				err = admin.Queue(qs.name).Configure(ctx, o)
			}
			for _, g := range allGroups() {
				if err == nil && r.gen["pause"] {
					// Recorded: it ends a pause whose process was killed
					// before its own Resume, and the final drain pops after.
					inv := r.rec.Invoke(history.Event{Proc: "heal", Op: history.OpCall, Kind: "resume", Queue: qs.name, Group: g})
					err = admin.Queue(qs.name).Resume(ctx, g)
					if err != nil {
						r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
					} else {
						r.rec.Done(inv, history.OK, history.Event{})
					}
				}
			}
		}
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			r.t.Fatalf("maintenance off: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// finalDrain reads every group of every queue to its end, acking as it
// goes, recording pops and acks like any consumer.
// drainLease is the final drain's lease: long enough to ack a batch of
// 1000 on a loaded machine.
const drainLease = 15 * time.Second

func (r *run) finalDrain(ctx context.Context, admin *queen.Client) int {
	// Past every lease a worker could have left behind (at most 3s).
	time.Sleep(3100 * time.Millisecond)
	r.waitScheduled(ctx, admin) // gen_sched_test.go
	n := 0
	type drain struct {
		q  string
		gs []string
	}
	var drains []drain
	for _, qs := range queueSpecs {
		gs := allGroups()
		if qs.name == "completed" {
			gs = append(gs, r.stormGroups()...)
		}
		drains = append(drains, drain{qs.name, gs})
	}
	for _, q := range r.extraQ {
		drains = append(drains, drain{q, slices.Concat(r.extra[q].Groups, r.extra[q].LateGroups, r.extra[q].Moved)})
	}
	for _, d := range drains {
		q := admin.Queue(d.q)
		for _, g := range d.gs {
			empty, lagPops, lagSince := 0, 0, time.Time{}
			deadline := time.Now().Add(90 * time.Second)
			start, pops, got := time.Now(), 0, 0
			for empty < 2 {
				if time.Now().After(deadline) {
					r.dumpWaits(ctx)
					r.t.Fatalf("final drain of %s/%q did not end (%d times two empty pops with lag)", d.q, g, lagPops)
				}
				// Each group's own subscription, as its workers pop: it
				// decides where a group that never popped during the run
				// starts (a group that reads everything must not join new).
				o := queen.PopOptions{Group: g, Batch: 1000, Partitions: 64, LeaseTime: drainLease}
				if r.citus {
					// On the distributed layout each partition's claim is a
					// few statements sent from the coordinator to its
					// worker: 64 took more than the statement timeout on
					// the loaded test machine, and every retry did too.
					o.Partitions = 8
				}
				switch {
				case g == fromGroup:
					o.Subscription = queen.SubscribeFrom(r.from)
				case slices.Contains(lateGroups, g):
					o.Subscription = queen.SubscribeNew
				}
				msgs, err := recordPopErr(ctx, r.rec, "final", q, o)
				pops++
				got += len(msgs)
				if err != nil {
					// A pop that timed out may have committed its claim: what
					// it took comes back once its lease ends.
					time.Sleep(o.LeaseTime + 100*time.Millisecond)
					continue
				}
				if len(msgs) == 0 {
					if until := r.retryWait(ctx, q, g); !until.IsZero() {
						// A failed message waits out its retry backoff: it
						// is not lost, and the drain must still read it.
						time.Sleep(time.Until(until) + 50*time.Millisecond)
						empty = 0
						continue
					}
					empty++
					if empty == 2 && r.citus && (lagSince.IsZero() || time.Since(lagSince) < 30*time.Second) {
						// An empty pop means nothing left to claim (a pop
						// whose windows missed reads what the group lags
						// on), but the layout's slow claims make a drain
						// the place a miss would show: the drain goes on for
						// up to 30 s while the group's cursors show lag
						// (which a paused group of an extra queue may show
						// for good), logs it, and the checker judges what
						// is left.
						if n := r.lagging(ctx, q, g); n > 0 {
							if lagSince.IsZero() {
								lagSince = time.Now()
							}
							lagPops++
							empty = 0
						}
					}
					continue
				}
				empty = 0
				n += len(msgs)
				// Progress: a group of thousands of one-message partitions
				// drains 8 partitions a pop on the distributed layout, for
				// minutes. "Did not end" means 90 s without a message; a
				// drain that never ends at all meets the run's bound.
				deadline = time.Now().Add(90 * time.Second)
				last := map[string]*queen.Message{}
				for _, m := range msgs {
					last[m.Partition] = m
				}
				for _, m := range last {
					recordSettle(ctx, r.rec, "final", m, "ack", nil)
				}
			}
			if took := time.Since(start); took > time.Minute {
				r.t.Logf("final drain of %s/%q: %d messages in %d pops, %s", d.q, g, got, pops, took.Round(time.Second))
			}
			if lagPops > 0 {
				r.t.Logf("final drain of %s/%q: %d times two empty pops while its cursors showed lag (%d partitions with lag at its end)",
					d.q, g, lagPops, r.lagging(ctx, q, g))
			}
		}
	}
	return n
}

// lagging is how many partitions of q group g's cursors show lag on
// (-1 when Status fails).
func (r *run) lagging(ctx context.Context, q *queen.Queue, g string) int {
	st, err := q.Status(ctx)
	if err != nil {
		return -1
	}
	n := 0
	for _, p := range st.Partitions {
		for _, gs := range p.Groups {
			if gs.Group == g && gs.Lag > 0 {
				n++
			}
		}
	}
	return n
}

// dumpWaits logs, on every node, the transactions that hold or wait for
// locks: what a drain that does not end is stuck behind (a prepared
// transaction a crash left, a lock wait).
func (r *run) dumpWaits(ctx context.Context) {
	nodes := append([]*pgcluster.Cluster{r.cl}, r.workers...)
	for i, n := range nodes {
		// The server logs beside the history, kept for a failed run: a
		// canceled statement's context names the line it was at.
		_ = os.WriteFile(filepath.Join(r.dir, fmt.Sprintf("node%d.log", i)), []byte(n.ServerLog()), 0o644)
		conn, err := pgx.Connect(ctx, n.URL)
		if err != nil {
			r.t.Logf("node %d: %v", i, err)
			continue
		}
		for _, q := range []string{
			`SELECT gid || ' ' || prepared::text FROM pg_prepared_xacts`,
			`SELECT pid || ' ' || coalesce(state, '') || ' ' || coalesce(wait_event_type || ':' || wait_event, '') || ' ' ||
				coalesce((now() - xact_start)::text, '') || ' blocked by ' || pg_blocking_pids(pid)::text || ' ' || left(query, 300)
			FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND state <> 'idle'`,
			`SELECT locktype || ' ' || coalesce(relation::regclass::text, '') || ' ' || mode || ' ' || coalesce(pid::text, 'prepared ' || virtualtransaction)
			FROM pg_locks WHERE pid IS NULL OR pid NOT IN (SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend') LIMIT 50`,
		} {
			rows, err := conn.Query(ctx, q)
			if err != nil {
				r.t.Logf("node %d: %v", i, err)
				continue
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			r.t.Logf("node %d: %q %v", i, lines, err)
		}
		conn.Close(ctx)
	}
}

// retryWait is the latest RetryAt of group g on q's partitions, or a
// moment from now while a FailureSkip copy waits to be appended (zero when
// none waits): a pop finding nothing meanwhile does not mean q is drained.
func (r *run) retryWait(ctx context.Context, q *queen.Queue, g string) time.Time {
	st, err := q.Status(ctx)
	if err != nil {
		return time.Time{} // an empty pop then counts as usual
	}
	var until time.Time
	if st.RetriesWaiting > 0 {
		until = time.Now().Add(200 * time.Millisecond)
	}
	for _, p := range st.Partitions {
		for _, gs := range p.Groups {
			if gs.Group == g && gs.RetryAt.After(until) {
				until = gs.RetryAt
			}
		}
	}
	return until
}

// readLog decodes every stored segment of the run's queues.
func (r *run) readLog(ctx context.Context, admin *queen.Client) []history.Stored {
	rows, err := admin.Pool().Query(ctx, fmt.Sprintf(`SELECT q.name, p.name, s.base_offset, s.failures, s.blob
		FROM %[1]s.segments s JOIN %[1]s.partitions p ON p.id = s.partition_id JOIN %[1]s.queues q ON q.id = p.queue_id`,
		pgx.Identifier{r.schema}.Sanitize()))
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	var out []history.Stored
	var raw []byte
	for rows.Next() {
		var qn, pn string
		var base int64
		var failures int
		var blob []byte
		if err := rows.Scan(&qn, &pn, &base, &failures, &blob); err != nil {
			r.t.Fatal(err)
		}
		raw, err = segment.Decompress(raw[:0], blob)
		if err != nil && (r.isDestroyed(qn, pn, base) || bytes.Equal(blob, corruptBlob)) {
			continue // a corrupted segment, or a requeued copy of one
		}
		if err != nil {
			r.t.Fatalf("%s/%s@%d: %v", qn, pn, base, err)
		}
		err = frame.Decode(raw, func(k int, f *frame.Frame) error {
			out = append(out, history.Stored{Queue: qn, Partition: pn, Offset: base + int64(k), ID: f.ID.String(), TxID: f.TransactionID, Failures: failures})
			return nil
		})
		if err != nil {
			r.t.Fatalf("%s/%s@%d: %v", qn, pn, base, err)
		}
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// child is one OS process running workers, killed and restarted on the
// same spool directory by the nemesis.
type child struct {
	r     *run
	idx   int
	spool string
	mu    sync.Mutex
	cmd   *exec.Cmd
	inc   int
}

func (c *child) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inc++
	proc := fmt.Sprintf("child-%d.%d", c.idx, c.inc)
	hist := filepath.Join(c.r.dir, proc+".jsonl")
	c.r.childFiles = append(c.r.childFiles, hist)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHistoryChild$")
	cmd.Env = append(os.Environ(), "QUEEN_HISTORY_CHILD="+string(mustJSON(childSpec{
		URL: c.r.url(), Schema: c.r.schema, Spool: c.spool, Key: c.r.key, Key2: c.r.key2, Gen: c.r.gen.String(), Proc: proc, History: hist, Citus: c.r.citus,
		Seed: c.r.seed*1000 + uint64(c.idx*100+c.inc), Deadline: time.Now().Add(c.r.dur + time.Minute).UnixNano(), From: c.r.from.UnixNano(),
	})))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		c.r.t.Errorf("start child: %v", err)
		return
	}
	c.cmd = cmd
}

func (c *child) signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		_ = c.cmd.Process.Signal(sig)
	}
}

func (c *child) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		_ = c.cmd.Process.Signal(syscall.SIGKILL) // also ends a SIGSTOP
		_ = c.cmd.Wait()
		c.cmd = nil
	}
}

type childSpec struct {
	URL, Schema, Spool, Proc, History, Gen string
	Key, Key2                              []byte
	Citus                                  bool
	Seed                                   uint64
	Deadline, From                         int64
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestHistoryChild is the process body of a child of TestHistory.
func TestHistoryChild(t *testing.T) {
	env := os.Getenv("QUEEN_HISTORY_CHILD")
	if env == "" {
		t.Skip("child process of TestHistory")
	}
	var s childSpec
	if err := json.Unmarshal([]byte(env), &s); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(s.History, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	rec := history.NewRecorder(f, false)
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, s.Deadline))
	defer cancel()
	cfg := queen.Config{DatabaseURL: s.URL, Schema: s.Schema, SpoolDir: s.Spool, EncryptionKey: s.Key,
		StatementTimeout: statementTimeout, Logger: slog.New(&claimLog{rec: rec, proc: s.Proc}), Citus: s.Citus}
	if s.Key2 != nil {
		cfg.DecryptionKeys = [][]byte{s.Key2}
	}
	gen, err := parseGens(s.Gen)
	if err != nil {
		t.Fatal(err)
	}
	var c *queen.Client
	for c == nil {
		if c, err = queen.Open(ctx, cfg); err != nil {
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	for w := range 3 {
		wk := &worker{c: c, rec: rec, proc: s.Proc, idx: w, rng: rand.New(rand.NewPCG(s.Seed, uint64(w))), from: time.Unix(0, s.From), gen: gen}
		wg.Go(func() { wk.loop(ctx) })
	}
	wg.Wait() // until killed, or the deadline if the parent died
	_ = c.Close(context.Background())
}

// nemesis injects faults at random moments until ctx ends.
type nemesis struct {
	r        *run
	admin    *queen.Client
	clients  []*queen.Client
	children []*child
	rng      *rand.Rand
	nokey    *queen.Client // a client without a key, for "firstpush"
}

// outage pushes to unseen queues while the database cannot answer
// ("firstpush"), by the keyless client and a keyed one.
func (n *nemesis) outage() {
	if !n.r.gen["firstpush"] {
		return
	}
	cs := []*queen.Client{n.clients[n.rng.IntN(len(n.clients))]}
	names := []string{"main-x"}
	if n.nokey != nil {
		cs, names = append(cs, n.nokey), append(names, "nokey")
	}
	for i, c := range cs {
		n.r.bg.Go(func() { n.r.firstPush(c, names[i]) })
	}
	time.Sleep(50 * time.Millisecond) // the pushes are under way before the database is back
}

func (n *nemesis) loop(ctx context.Context) {
	start, stormed := time.Now(), false
	// "spoolwin" needs a maintenance window a run: one of its own between
	// two faults, drawing nothing from the nemesis's generator.
	own := func() {
		if n.r.sw != nil && n.r.sw.n == 0 && time.Since(start) > n.r.dur/4 && ctx.Err() == nil {
			n.fault("maintenance", func() error { return n.r.sw.ownWindow(ctx, n.admin) })
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(500+n.rng.IntN(2000)) * time.Millisecond):
		}
		kinds := []string{"restart", "terminate", "lock", "maintenance", "kill-child", "pause-child", "exhaust", "corrupt"}
		if n.r.gen["storm"] {
			kinds = append(kinds, "storm")
		}
		if len(n.r.workers) > 0 {
			kinds = append(kinds, "stop-worker")
		}
		kind := kinds[n.rng.IntN(len(kinds))]
		if n.r.gen["storm"] && !stormed && time.Since(start) > n.r.dur/4 {
			kind = "storm" // at least once a run: its race is rare
		}
		first := len(n.r.workers) > 0 && n.r.restarts.Load() == 0
		if first {
			kind = "restart" // the coordinator, at least once a run: the first, as faults are few
		}
		stormed = stormed || kind == "storm"
		if !first {
			own()
		}
		n.fault(kind, func() error { return n.inject(ctx, kind) })
		if len(n.r.workers) > 0 && n.r.workerDown.Load() == 0 {
			// A worker stopped and started, at least once a run too: right
			// after the first fault, before a maintenance window (own)
			// takes the rest of a short run, and even if the run's time
			// ran out meanwhile (restarts are slow on a loaded machine):
			// then it meets the last operations and the drains.
			time.Sleep(time.Duration(300+n.rng.IntN(500)) * time.Millisecond)
			n.fault("stop-worker", func() error { return n.inject(context.WithoutCancel(ctx), "stop-worker") })
		}
		own()
	}
}

func (n *nemesis) fault(kind string, inject func() error) {
	inv := n.r.rec.Invoke(history.Event{Proc: "nemesis", Op: history.OpFault, Kind: kind})
	err := inject()
	res := history.Event{}
	if err != nil {
		res.Err = err.Error()
	}
	n.r.rec.Done(inv, history.OK, res)
	n.r.faults.Add(1)
	n.r.kindsMu.Lock()
	if n.r.kinds == nil {
		n.r.kinds = map[string]int{}
	}
	n.r.kinds[kind]++
	n.r.kindsMu.Unlock()
}

func (n *nemesis) inject(ctx context.Context, kind string) error {
	sleep := func(ms int) { time.Sleep(time.Duration(ms+n.rng.IntN(ms+1)) * time.Millisecond) }
	switch kind {
	case "restart":
		if err := n.r.cl.Stop("immediate"); err != nil {
			return err
		}
		n.r.restarts.Add(1)
		n.outage()
		sleep(300)
		return n.r.cl.Start(context.Background())
	case "stop-worker":
		// A Citus worker down and back: the coordinator's own tables
		// must not depend on it.
		w := n.r.workers[n.rng.IntN(len(n.r.workers))]
		if err := w.Stop("immediate"); err != nil {
			return err
		}
		n.r.workerDown.Add(1)
		sleep(300)
		return w.Start(context.Background())
	case "terminate":
		conn, err := pgx.Connect(ctx, n.r.url())
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() ORDER BY random() LIMIT 3`)
		return err
	case "lock":
		// A partition row held past the statement timeout: the pushes and
		// claims that need it time out, spool or skip it.
		conn, err := pgx.Connect(ctx, n.r.url())
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.Background())
		_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s.partitions WHERE name = $1 FOR NO KEY UPDATE`, pgx.Identifier{n.r.schema}.Sanitize()),
			fmt.Sprintf("s%d", n.rng.IntN(smallKeys)))
		if err != nil {
			return err
		}
		time.Sleep(statementTimeout + 500*time.Millisecond)
		return nil
	case "maintenance":
		n.r.maintMu.RLock()
		defer n.r.maintMu.RUnlock()
		if err := n.admin.SetMaintenance(ctx, true); err != nil {
			return err
		}
		n.r.sw.window() // its pushes that must be spooled, before the window can end
		n.outage()
		sleep(400)
		for ctx.Err() == nil {
			if err := n.admin.SetMaintenance(context.Background(), false); err == nil {
				return nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Heal turns it off.
		return nil
	case "storm":
		return n.storm(ctx, time.Duration(1000+n.rng.IntN(1500))*time.Millisecond)
	case "corrupt":
		// A segment of the strict-order queue overwritten with garbage (a
		// bad disk, a bad restore): its messages must go to the dead
		// letters alone, never take the rest of a pop with them or block
		// their partition.
		return n.r.corrupt(ctx)
	case "pause-child":
		// A stopped process (a GC pause, a frozen VM): its leases expire
		// while it still believes it holds them.
		if len(n.children) == 0 {
			return nil
		}
		c := n.children[n.rng.IntN(len(n.children))]
		c.signal(syscall.SIGSTOP)
		sleep(1000)
		c.signal(syscall.SIGCONT)
	case "exhaust":
		// Every connection of one client's pool taken past the statement
		// timeout: its pushes must spool, its pops fail and retry.
		c := n.clients[n.rng.IntN(len(n.clients))]
		var held []*pgxpool.Conn
		for range c.Pool().Config().MaxConns {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			conn, err := c.Pool().Acquire(actx)
			cancel()
			if err != nil {
				break
			}
			held = append(held, conn)
		}
		time.Sleep(statementTimeout + 500*time.Millisecond)
		for _, conn := range held {
			conn.Release()
		}
	case "kill-child":
		if len(n.children) == 0 {
			return nil
		}
		c := n.children[n.rng.IntN(len(n.children))]
		c.kill()
		sleep(100)
		if ctx.Err() == nil {
			c.start()
		}
	}
	return nil
}

const (
	smallKeys = 8
	largeKeys = 2000
)

// worker draws operations at random and records each.
type worker struct {
	c    *queen.Client
	rec  *history.Recorder
	proc string
	// idx tells the workers of one process apart in the transaction ids
	// they mint (they share proc).
	idx  int
	rng  *rand.Rand
	from time.Time
	n    int
	// recent transaction ids of this worker, for deliberate retries.
	recent []history.Item
	rqueue []string
	gen    gens
	// r and other (another client of this process) are set in the test
	// process only: the generators that need them run there.
	r     *run
	other *queen.Client
	// moving counts the offsets operator's calls by kind and outcome.
	moving map[string]int
}

func (w *worker) loop(ctx context.Context) {
	mis := w.misuser(ctx) // "misuse": once, at a random moment
	for ctx.Err() == nil {
		mis.maybe(ctx)
		opCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		switch x := w.rng.IntN(100 + 15*min(len(w.gen), 1)); {
		case x < 35:
			w.push(opCtx)
		case x < 40:
			w.pushTx(opCtx)
		case x < 44:
			w.tx(opCtx)
		case x < 76:
			w.popSettle(opCtx)
		case x < 82:
			w.popAckBatch(opCtx)
		case x < 92:
			w.consume(opCtx)
		case x < 96:
			_, _ = w.c.Maintain(opCtx)
		case x < 100:
			q := w.queue()
			_ = w.c.Queue(q).Configure(opCtx, w.options(q))
		default:
			w.extra(opCtx)
		}
		cancel()
	}
}

func (w *worker) queue() string { return queueSpecs[w.rng.IntN(len(queueSpecs))].name }

// options keeps a queue's fixed settings and redraws RetryLimit and lease.
func (w *worker) options(q string) queen.QueueOptions {
	for _, qs := range queueSpecs {
		if qs.name == q {
			o := qs.opts
			o.RetryLimit = 1 + w.rng.IntN(3)
			o.LeaseTime = time.Duration(300+w.rng.IntN(1700)) * time.Millisecond
			o.DelayedProcessing = []time.Duration{0, 0, 150 * time.Millisecond}[w.rng.IntN(3)]
			// Settings that change what is kept move within what the
			// checker assumes of the queue: windows longer than any run,
			// retention on only where it was on.
			if o.DedupWindow > 0 {
				o.DedupWindow = []time.Duration{time.Hour, 2 * time.Hour}[w.rng.IntN(2)]
			}
			if o.Retention > 0 {
				o.Retention = []time.Duration{3 * time.Second, 5 * time.Second}[w.rng.IntN(2)]
			}
			if o.CompletedRetention > 0 {
				o.CompletedRetention = []time.Duration{300 * time.Millisecond, time.Second}[w.rng.IntN(2)]
			}
			if q == "pause" || q == "skip" {
				o.FailurePolicy = []queen.FailurePolicy{queen.FailurePause, queen.FailureSkip}[w.rng.IntN(2)]
			}
			return o
		}
	}
	panic(q)
}

func (w *worker) items(q string) []queen.Item {
	n := 1
	switch x := w.rng.IntN(100); {
	case x < 50:
		n = 1 + w.rng.IntN(3)
	case x < 90:
		n = 1 + w.rng.IntN(50)
	case x < 99:
		n = 1 + w.rng.IntN(300)
	default:
		n = 1 + w.rng.IntN(1000)
	}
	large := w.rng.IntN(4) == 0
	items := make([]queen.Item, n)
	for i := range items {
		if len(w.recent) > 0 && w.rng.IntN(30) == 0 && w.rqueue[len(w.rqueue)-1] == q {
			// A producer retry: same transaction id, same partition.
			it := w.recent[w.rng.IntN(len(w.recent))]
			items[i] = queen.Item{Partition: it.Partition, TransactionID: it.TxID, Key: keyOf(it.TxID), Data: payload(q, it.TxID)}
			continue
		}
		w.n++
		p := fmt.Sprintf("s%d", w.rng.IntN(smallKeys))
		if large {
			p = fmt.Sprintf("k%d", w.rng.IntN(largeKeys))
		}
		tx := w.proc + "." + strconv.Itoa(w.idx) + "/" + strconv.Itoa(w.n) + "/" + strconv.FormatUint(w.rng.Uint64()%1e6, 36)
		items[i] = queen.Item{Partition: p, TransactionID: tx, Key: keyOf(tx), Data: payload(q, tx)}
		if w.rng.IntN(5) == 0 {
			// Keyed: the queue's lanes route it (histItems names the lane).
			items[i].Partition, items[i].Key = "", fmt.Sprintf("key%d", w.rng.IntN(largeKeys))
		}
	}
	return items
}

// keyOf is an item's ordering key, a function of its transaction id so a
// producer retry repeats it: one of four keys, or none.
func keyOf(tx string) string {
	h := fnv.New64a()
	h.Write([]byte(tx))
	if k := h.Sum64() % 5; k < 4 {
		return "key" + strconv.FormatUint(k, 10)
	}
	return ""
}

func (w *worker) remember(q string, items []queen.Item) {
	if len(w.rqueue) == 0 || w.rqueue[len(w.rqueue)-1] != q {
		w.recent, w.rqueue = w.recent[:0], append(w.rqueue[:0], q)
	}
	w.recent = append(w.recent, histItems(items)...)
	if len(w.recent) > 64 {
		w.recent = w.recent[len(w.recent)-64:]
	}
}

func histItems(items []queen.Item) []history.Item {
	out := make([]history.Item, len(items))
	for i, it := range items {
		p := it.Partition
		if p == "" && it.Key != "" {
			// The documented lane rule, with the default 64 lanes (the
			// run never configures Lanes).
			p = "lane-" + strconv.FormatUint(xxh3.HashString(it.Key)%queen.DefaultLanes, 10)
		}
		out[i] = history.Item{Partition: p, TxID: it.TransactionID}
	}
	return out
}

// itemErr is the error of the first failed item of a push.
func itemErr(rs []queen.PushResult) string {
	for _, r := range rs {
		if r.Status == queen.Failed && r.Err != nil {
			return r.Err.Error()
		}
	}
	return ""
}

func histResults(rs []queen.PushResult) []history.Result {
	out := make([]history.Result, len(rs))
	for i, r := range rs {
		out[i] = history.Result{Status: string(r.Status), ID: r.MessageID.String(), Offset: r.Offset}
	}
	return out
}

// slowPushDumped: the first Push of this process to outlive 8 s leaves
// its goroutines in a file, so that a push-error can be run down after the
// run (the history says when, not where it waited).
var slowPushDumped atomic.Bool

func dumpSlowPush(proc, queue string) {
	if !slowPushDumped.CompareAndSwap(false, true) {
		return
	}
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	name := filepath.Join(os.TempDir(), fmt.Sprintf("queen-slowpush-%d-%s.txt", os.Getpid(), time.Now().UTC().Format("150405.000")))
	head := fmt.Sprintf("proc %s, queue %s: a Push still running after 8 s\n\n", proc, queue)
	if err := os.WriteFile(name, append([]byte(head), buf...), 0o644); err == nil {
		fmt.Fprintf(os.Stderr, "history: slow push dumped to %s\n", name)
	}
}

func (w *worker) push(ctx context.Context) {
	q := w.queue()
	items := w.items(q)
	inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Queue: q, Items: histItems(items)})
	// The end of the run must not cut a Push short: an error from a caller
	// giving up is not the push-error the checker looks for, a Push that
	// takes 10 s is.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	slow := time.AfterFunc(8*time.Second, func() { dumpSlowPush(w.proc, q) })
	res, err := w.c.Queue(q).Push(pctx, items)
	slow.Stop()
	if err != nil {
		w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return
	}
	w.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
	w.remember(q, items)
}

// pushTx pushes inside the caller's transaction, then commits or rolls back.
func (w *worker) pushTx(ctx context.Context) {
	q := w.queue()
	items := w.items(q)
	rollback := w.rng.IntN(3) == 0
	inv := history.Event{Proc: w.proc, Op: history.OpPush, Kind: "pushtx", Queue: q, Items: histItems(items), Rollback: rollback}
	inv = w.rec.Invoke(inv)
	tx, err := w.c.Pool().Begin(ctx)
	if err != nil {
		w.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
		return
	}
	defer tx.Rollback(context.Background())
	res, err := w.c.Queue(q).PushTx(ctx, tx, items)
	if err != nil || rollback {
		_ = tx.Rollback(ctx)
		phase := history.Fail
		if rollback && err == nil {
			phase = history.OK
		}
		w.rec.Done(inv, phase, history.Event{Err: errText(err)})
		return
	}
	if err := tx.Commit(ctx); err != nil {
		w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return
	}
	w.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// tx acks one popped message and pushes items in one Client.Tx.
func (w *worker) tx(ctx context.Context) {
	q := w.queue()
	g := groups[w.rng.IntN(len(groups))]
	msgs := recordPop(ctx, w.rec, w.proc, w.c.Queue(q), queen.PopOptions{Group: g})
	if len(msgs) == 0 {
		return
	}
	m := msgs[0]
	dst := w.queue()
	items := w.items(dst)
	// Sometimes a second Push to the same queue and partitions (fresh
	// transaction ids): one call to the checker, as a partition's items of
	// both are stored in call order.
	var more []queen.Item
	if w.rng.IntN(3) == 0 {
		more = make([]queen.Item, 1+w.rng.IntN(len(items)))
		for i := range more {
			src := items[w.rng.IntN(len(items))]
			w.n++
			tx := w.proc + "." + strconv.Itoa(w.idx) + "/" + strconv.Itoa(w.n) + "/" + strconv.FormatUint(w.rng.Uint64()%1e6, 36)
			more[i] = queen.Item{Partition: src.Partition, Key: src.Key, TransactionID: tx, Data: payload(dst, tx)}
		}
	}
	all := append(slices.Clone(items), more...)
	sinv := w.rec.Invoke(settleEvent(w.proc, m, "ack"))
	pinv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Kind: "tx", Queue: dst, Items: histItems(all)})
	err := w.c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Ack(m)
		tx.Push(dst, items)
		if more != nil {
			tx.Push(dst, more)
		}
		return nil
	})
	items = all
	switch {
	case err == nil:
		w.rec.Done(sinv, history.OK, history.Event{})
		res := make([]history.Result, len(items))
		for i := range res {
			res[i] = history.Result{Status: "committed", Offset: -1}
		}
		w.rec.Done(pinv, history.OK, history.Event{Results: res})
	case errors.Is(err, queen.ErrTxAborted):
		w.rec.Done(sinv, history.Fail, history.Event{Err: err.Error(), LeaseLost: errors.Is(err, queen.ErrLeaseLost)})
		w.rec.Done(pinv, history.Fail, history.Event{Err: err.Error()})
	default:
		w.rec.Done(sinv, history.Info, history.Event{Err: err.Error()})
		w.rec.Done(pinv, history.Info, history.Event{Err: err.Error()})
	}
}

func (w *worker) popOptions() queen.PopOptions {
	o := queen.PopOptions{Group: groups[w.rng.IntN(len(groups))]}
	if w.rng.IntN(8) == 0 {
		o.Group, o.Subscription = lateGroups[w.rng.IntN(len(lateGroups))], queen.SubscribeNew
		if w.rng.IntN(2) == 0 {
			o.Group, o.Subscription = fromGroup, queen.SubscribeFrom(w.from)
		}
	}
	o.Batch = []int{1, 1, 10, 100}[w.rng.IntN(4)]
	o.Partitions = []int{1, 1, 1, 4}[w.rng.IntN(4)]
	o.AutoAck = w.rng.IntN(7) == 0
	if w.rng.IntN(4) == 0 {
		o.Wait = 200 * time.Millisecond
	}
	o.LeaseTime = []time.Duration{0, 0, 500 * time.Millisecond, 3 * time.Second}[w.rng.IntN(4)]
	if w.rng.IntN(10) == 0 {
		o.Partition = fmt.Sprintf("s%d", w.rng.IntN(smallKeys))
	}
	return o
}

func delivery(m *queen.Message) history.Delivery {
	d := history.Delivery{Partition: m.Partition, Offset: m.Offset, ID: m.ID.String(), TxID: m.TransactionID, Lease: m.LeaseID, Attempt: m.Attempt}
	if !m.LeaseExpiresAt.IsZero() {
		d.LeaseExpires = m.LeaseExpiresAt.UnixNano()
	}
	return d
}

// badData returns the deliveries of msgs whose Data is not what was pushed.
// The queues of queueSpecs hold only payload(queue, transaction id); a
// destroyed message's dead letter (nil id) has nothing to compare.
func badData(msgs ...*queen.Message) []history.Delivery {
	var out []history.Delivery
	for _, m := range msgs {
		if slices.ContainsFunc(queueSpecs, func(qs queueSpec) bool { return qs.name == m.Queue }) && !m.ID.IsNil() &&
			!bytes.Equal(m.Data, payload(m.Queue, m.TransactionID)) {
			out = append(out, delivery(m))
		}
	}
	return out
}

func recordPop(ctx context.Context, rec *history.Recorder, proc string, q *queen.Queue, o queen.PopOptions) []*queen.Message {
	msgs, _ := recordPopErr(ctx, rec, proc, q, o)
	return msgs
}

func recordPopErr(ctx context.Context, rec *history.Recorder, proc string, q *queen.Queue, o queen.PopOptions) ([]*queen.Message, error) {
	if q.Name() == "doomed" && o.LeaseTime == 0 {
		o.LeaseTime = time.Second // a recreated queue's default lease outlasts the final drain
	}
	inv := rec.Invoke(history.Event{Proc: proc, Op: history.OpPop, Queue: q.Name(), Group: o.Group, AutoAck: o.AutoAck, Batch: o.Batch})
	msgs, err := q.Pop(ctx, o)
	if err != nil {
		rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return nil, err
	}
	ds := make([]history.Delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = delivery(m)
	}
	rec.Done(inv, history.OK, history.Event{Msgs: ds, BadData: badData(msgs...)})
	return msgs, nil
}

func settleEvent(proc string, m *queen.Message, kind string) history.Event {
	return history.Event{Proc: proc, Op: history.OpSettle, Queue: m.Queue, Group: m.Group, Kind: kind,
		Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, ID: m.ID.String()}
}

// recordSettle applies one verdict and records it: ok when it applied,
// fail when it certainly did not (lease lost, already acked), info else.
func recordSettle(ctx context.Context, rec *history.Recorder, proc string, m *queen.Message, kind string, rng *rand.Rand) error {
	return recordSettleWhy(ctx, rec, proc, m, kind, rng, nil)
}

// recordSettleWhy is recordSettle with the reason of a fail or dead letter
// (nil: a plain one).
func recordSettleWhy(ctx context.Context, rec *history.Recorder, proc string, m *queen.Message, kind string, rng *rand.Rand, why error) error {
	inv := rec.Invoke(settleEvent(proc, m, kind))
	var err error
	switch kind {
	case "ack":
		err = m.Ack(ctx)
	case "fail":
		err = m.Fail(ctx, cmp.Or(why, errors.New("history: failed on purpose")))
	case "retry":
		err = m.Retry(ctx)
	case "dead":
		err = m.DeadLetter(ctx, cmp.Or(why, errors.New("history: dead on purpose")))
	case "extend":
		err = m.ExtendLease(ctx, time.Duration(200+rng.IntN(2000))*time.Millisecond)
	}
	switch {
	case err == nil:
		rec.Done(inv, history.OK, history.Event{})
	case errors.Is(err, queen.ErrLeaseLost), errors.Is(err, queen.ErrAlreadyAcked):
		rec.Done(inv, history.Fail, history.Event{Err: err.Error(), LeaseLost: errors.Is(err, queen.ErrLeaseLost)})
	default:
		rec.Done(inv, history.Info, history.Event{Err: err.Error()})
	}
	return err
}

// popSettle pops, then handles the batch in order the way a consumer
// would: ack each or only the last, fail, retry, dead-letter, extend, or
// walk away and let the lease expire.
func (w *worker) popSettle(ctx context.Context) {
	q := w.queue()
	o := w.popOptions()
	msgs := recordPop(ctx, w.rec, w.proc, w.c.Queue(q), o)
	if len(msgs) == 0 || o.AutoAck {
		return
	}
	byPart := map[string][]*queen.Message{}
	var order []string
	for _, m := range msgs {
		if _, ok := byPart[m.Partition]; !ok {
			order = append(order, m.Partition)
		}
		byPart[m.Partition] = append(byPart[m.Partition], m)
	}
	for _, p := range order {
		ms := byPart[p]
		if w.rng.IntN(2) == 0 {
			// Ack only the last: completes the batch.
			if w.rng.IntN(15) != 0 {
				_ = recordSettle(ctx, w.rec, w.proc, ms[len(ms)-1], "ack", w.rng)
			}
			continue
		}
	each:
		for _, m := range ms {
			switch x := w.rng.IntN(100); {
			case x < 80:
				if recordSettle(ctx, w.rec, w.proc, m, "ack", w.rng) != nil {
					break each
				}
			case x < 88:
				w.scribble(m)
				_ = recordSettleWhy(ctx, w.rec, w.proc, m, "fail", w.rng, w.reason("history: failed on purpose"))
				break each
			case x < 92:
				_ = recordSettle(ctx, w.rec, w.proc, m, "retry", w.rng)
				break each
			case x < 95:
				w.scribble(m)
				if recordSettleWhy(ctx, w.rec, w.proc, m, "dead", w.rng, w.reason("history: dead on purpose")) != nil {
					break each
				}
			case x < 98:
				if recordSettle(ctx, w.rec, w.proc, m, "extend", w.rng) != nil {
					break each
				}
			default:
				break each // abandoned: the lease expires
			}
		}
	}
}

// consume runs Consume for a moment with a handler that sometimes fails or
// outlives its lease.
func (w *worker) consume(ctx context.Context) {
	q := w.queue()
	o := queen.ConsumeOptions{PopOptions: w.popOptions(), Concurrency: 1 + w.rng.IntN(4), KeyConcurrency: 1 + w.rng.IntN(3)}
	// AutoAck is at-most-once: a Consume pop that commits and then loses
	// its connection, or a process killed before its handler ran, drops
	// messages nobody saw, and Consume's pops are not in the history to
	// account for them. Recorded pops exercise AutoAck instead.
	o.Partition, o.Wait, o.AutoAck = "", 200*time.Millisecond, false
	// With "autoack", some do: the call is recorded, and a fault near it or
	// a failed claim excuses what its claims may have taken unseen. Only
	// group g2, so that excuse leaves the other groups checked.
	if w.gen["autoack"] && w.rng.IntN(4) == 0 {
		o.AutoAck, o.Group, o.Subscription = true, "g2", queen.Subscription{}
	}
	if q == "doomed" && o.LeaseTime == 0 {
		o.LeaseTime = time.Second
	}
	if w.gen["softstop"] && w.rng.IntN(3) == 0 {
		o.SoftStop = time.Duration(50+w.rng.IntN(400)) * time.Millisecond
	}
	if w.gen["timeout"] && w.rng.IntN(3) == 0 {
		o.HandlerTimeout = time.Duration(50+w.rng.IntN(300)) * time.Millisecond
	}
	txMode := w.gen["txconsume"] && w.rng.IntN(3) == 0 && !o.AutoAck
	badText := w.gen["texts"] && w.rng.IntN(2) == 0
	cctx, cancel := context.WithTimeout(ctx, time.Duration(300+w.rng.IntN(1500))*time.Millisecond)
	defer cancel()
	var mu sync.Mutex
	seed := w.rng.Uint64()
	hrng := rand.New(rand.NewPCG(seed, 7))
	returned := make(chan struct{})
	var call history.Event
	if o.AutoAck {
		call = w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "consume", Queue: q, Group: o.Group, AutoAck: true, Keyed: o.KeyConcurrency > 1})
	}
	go func() {
		defer close(returned)
		err := w.c.Queue(q).Consume(cctx, o, func(hctx context.Context, m *queen.Message) error {
			d := delivery(m)
			inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpHandler, Queue: q, Group: m.Group,
				Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{d}, BadData: badData(m), AutoAck: o.AutoAck})
			mu.Lock()
			x := hrng.IntN(100)
			bad := badReason(hrng)
			mu.Unlock()
			if o.AutoAck {
				// A batch takes a while: the stop meets keys not started yet.
				time.Sleep(5 * time.Millisecond)
			}
			var err error
			switch {
			case x < 8:
				if txMode && o.KeyConcurrency > 1 {
					// A failure after a slow call: other keys' handlers of
					// the batch settle meanwhile, in their own transactions.
					time.Sleep(20 * time.Millisecond)
				}
				err = errors.New("history: handler failed on purpose")
				if badText {
					err = bad
				}
				if w.gen["scribble"] {
					scribble(m)
				}
			case x < 10:
				select { // outlive the lease (Consume renews it)
				case <-time.After(time.Until(m.LeaseExpiresAt) + 100*time.Millisecond):
				case <-hctx.Done():
				}
			case x < 12:
				// Return only once Consume's context ended, with an error: a
				// shutdown, not a failure.
				<-hctx.Done()
				err = hctx.Err()
			case x < 15 && o.HandlerTimeout > 0:
				// Outlive the handler's deadline and fail for it.
				<-hctx.Done()
				err = fmt.Errorf("history: handler timed out: %w", hctx.Err())
			case x < 17 && w.gen["panic"]:
				w.rec.Done(inv, history.OK, history.Event{Err: "history: panicked on purpose"})
				panic("history: panicked on purpose")
			case txMode && (x < 40 || x < 75 && o.KeyConcurrency > 1):
				err = w.handlerTx(hctx, m, o.KeyConcurrency > 1, &mu)
			}
			w.rec.Done(inv, history.OK, history.Event{Err: errText(err)})
			return err
		})
		if o.AutoAck {
			w.rec.Done(call, history.OK, history.Event{Err: errText(err)})
		}
	}()
	select {
	case <-returned:
	case <-time.After(time.Until(deadlineOf(cctx)) + o.SoftStop + 20*time.Second):
		// A Consume that never returns once its context ended: say so and
		// go on (its goroutine is left behind).
		inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "consume", Queue: q, Group: o.Group})
		w.rec.Done(inv, history.Info, history.Event{Err: "stuck: Consume did not return 20s after its context ended"})
	}
}

// scribble writes over a message's Data, as a handler may: a stored copy
// (a dead letter, a FailureSkip re-enqueue) must keep the payload pushed.
func scribble(m *queen.Message) {
	for i := range m.Data {
		m.Data[i] = '#'
	}
}

func (w *worker) scribble(m *queen.Message) {
	if w.gen["scribble"] {
		scribble(m)
	}
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// readOrphans reads the rows left of partitions that no longer exist.
func (r *run) readOrphans(ctx context.Context, admin *queen.Client) []history.Orphan {
	var out []history.Orphan
	for _, table := range []string{"segments", "txns"} {
		rows, err := admin.Pool().Query(ctx, fmt.Sprintf(`SELECT t.partition_id, count(*) FROM %[1]s.%[2]s t
			WHERE NOT EXISTS (SELECT 1 FROM %[1]s.partitions p WHERE p.id = t.partition_id) GROUP BY t.partition_id`,
			pgx.Identifier{r.schema}.Sanitize(), table))
		if err != nil {
			r.t.Fatal(err)
		}
		for rows.Next() {
			o := history.Orphan{Table: table}
			if err := rows.Scan(&o.Partition, &o.Rows); err != nil {
				r.t.Fatal(err)
			}
			out = append(out, o)
		}
		if err := rows.Err(); err != nil {
			r.t.Fatal(err)
		}
	}
	return out
}

// readDeadLetters reads the final dead-letter store.
func (r *run) readDeadLetters(ctx context.Context, admin *queen.Client) []history.DeadStored {
	rows, err := admin.Pool().Query(ctx, fmt.Sprintf(`SELECT q.name, d.group_name, d.partition_name, d.msg_offset, d.message_id::text,
		d.transaction_id, coalesce(d.reason, '') FROM %[1]s.dead_letters d JOIN %[1]s.queues q ON q.id = d.queue_id`,
		pgx.Identifier{r.schema}.Sanitize()))
	if err != nil {
		r.t.Fatal(err)
	}
	var out []history.DeadStored
	var d history.DeadStored
	_, err = pgx.ForEachRow(rows, []any{&d.Queue, &d.Group, &d.Partition, &d.Offset, &d.ID, &d.TxID, &d.Reason}, func() error {
		out = append(out, d)
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// dumpPartition logs the database's view of a violation's partition.
func (r *run) dumpPartition(ctx context.Context, admin *queen.Client, v history.Violation) {
	rows, err := admin.Pool().Query(ctx, fmt.Sprintf(`SELECT p.id, p.last_offset, p.log_start, p.pending, p.created_at,
		coalesce(c.group_name, '-'), coalesce(c.committed, -2), c.lease_expires_at, c.updated_at
		FROM %[1]s.partitions p JOIN %[1]s.queues q ON q.id = p.queue_id
		LEFT JOIN %[1]s.consumers c ON c.partition_id = p.id
		WHERE q.name = $1 AND p.name = $2 ORDER BY 6`, pgx.Identifier{r.schema}.Sanitize()), v.Queue, v.Partition)
	if err != nil {
		r.t.Log(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id, last, start, committed int64
		var pending bool
		var created time.Time
		var group string
		var exp, upd *time.Time
		if err := rows.Scan(&id, &last, &start, &pending, &created, &group, &committed, &exp, &upd); err != nil {
			r.t.Log(err)
			return
		}
		r.t.Logf("    db: partition %s id %d last %d start %d pending %v created %s | group %q committed %d lease %v updated %v",
			v.Partition, id, last, start, pending, created.Format("15:04:05.000"), group, committed, exp, upd)
	}
	rows.Close()
	// How the group met the queue, and what the partition dead-lettered:
	// what a never-delivered message needs explained.
	s := pgx.Identifier{r.schema}.Sanitize()
	r.dumpRows(ctx, admin, "subscription", fmt.Sprintf(`SELECT s.group_name, s.mode, s.created_at, s.from_time
		FROM %[1]s.subscriptions s JOIN %[1]s.queues q ON q.id = s.queue_id WHERE q.name = $1 ORDER BY 1`, s), v.Queue)
	r.dumpRows(ctx, admin, "dead letter", fmt.Sprintf(`SELECT d.group_name, d.msg_offset, d.attempts, d.reason, d.created_at
		FROM %[1]s.dead_letters d JOIN %[1]s.queues q ON q.id = d.queue_id
		WHERE q.name = $1 AND d.partition_name = $2 ORDER BY d.msg_offset LIMIT 20`, s), v.Queue, v.Partition)
	// Whether the group could still reach it: a pending partition or a
	// backlog row is in a pop's reach, one with neither is stranded.
	r.dumpRows(ctx, admin, "backlog", fmt.Sprintf(`SELECT b.group_name FROM %[1]s.backlog b
		JOIN %[1]s.partitions p ON p.id = b.partition_id JOIN %[1]s.queues q ON q.id = p.queue_id
		WHERE q.name = $1 AND p.name = $2 ORDER BY 1`, s), v.Queue, v.Partition)
}

// dumpRows logs every row of a diagnostic query, its columns as text.
func (r *run) dumpRows(ctx context.Context, admin *queen.Client, what, sql string, args ...any) {
	rows, err := admin.Pool().Query(ctx, sql, args...)
	if err != nil {
		r.t.Log(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			r.t.Log(err)
			return
		}
		r.t.Logf("    db: %s %v", what, vals)
	}
}

// popAckBatch pops and settles the batch with one AckBatch of mixed
// outcomes, in order.
func (w *worker) popAckBatch(ctx context.Context) {
	q := w.queue()
	o := w.popOptions()
	o.AutoAck = false
	msgs := recordPop(ctx, w.rec, w.proc, w.c.Queue(q), o)
	if len(msgs) == 0 {
		return
	}
	kinds := map[queen.AckStatus]string{queen.AckSuccess: "ack", queen.AckFail: "fail", queen.AckRetry: "retry", queen.AckDeadLetter: "dead"}
	var reqs []queen.AckRequest
	var invs []history.Event
	for _, m := range msgs {
		st := queen.AckSuccess
		if x := w.rng.IntN(100); x < 6 {
			st = queen.AckFail
		} else if x < 8 {
			st = queen.AckRetry
		} else if x < 10 {
			st = queen.AckDeadLetter
		}
		reqs = append(reqs, queen.AckRequest{Message: m, Status: st, Reason: w.reason("history: batch")})
		invs = append(invs, w.rec.Invoke(settleEvent(w.proc, m, kinds[st])))
	}
	errs, err := w.c.Queue(q).AckBatch(ctx, reqs)
	for i, inv := range invs {
		switch {
		case err != nil:
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		case errs[i] == nil:
			w.rec.Done(inv, history.OK, history.Event{})
		case errors.Is(errs[i], queen.ErrLeaseLost), errors.Is(errs[i], queen.ErrAlreadyAcked), errors.Is(errs[i], queen.ErrAckSkipped):
			w.rec.Done(inv, history.Fail, history.Event{Err: errs[i].Error(), LeaseLost: errors.Is(errs[i], queen.ErrLeaseLost)})
		default:
			w.rec.Done(inv, history.Info, history.Event{Err: errs[i].Error()})
		}
	}
}

// logStarts reads each partition's oldest retained offset.
func (r *run) logStarts(ctx context.Context, admin *queen.Client) map[string]map[string]int64 {
	rows, err := admin.Pool().Query(ctx, fmt.Sprintf(`SELECT q.name, p.name, p.log_start FROM %[1]s.partitions p JOIN %[1]s.queues q ON q.id = p.queue_id`,
		pgx.Identifier{r.schema}.Sanitize()))
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	var qn, pn string
	var start int64
	_, err = pgx.ForEachRow(rows, []any{&qn, &pn, &start}, func() error {
		if out[qn] == nil {
			out[qn] = map[string]int64{}
		}
		out[qn][pn] = start
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// checkSecretLog: every stored frame of the encrypted queue is flagged
// encrypted and holds no plaintext.
func (r *run) checkSecretLog(ctx context.Context, admin *queen.Client) {
	rows, err := admin.Pool().Query(ctx, fmt.Sprintf(`SELECT s.blob FROM %[1]s.segments s JOIN %[1]s.partitions p ON p.id = s.partition_id
		JOIN %[1]s.queues q ON q.id = p.queue_id WHERE q.name = 'secret'`, pgx.Identifier{r.schema}.Sanitize()))
	if err != nil {
		r.t.Fatal(err)
	}
	var blob, raw []byte
	_, err = pgx.ForEachRow(rows, []any{&blob}, func() error {
		raw, err = segment.Decompress(raw[:0], blob)
		if err != nil {
			return err
		}
		return frame.Decode(raw, func(k int, f *frame.Frame) error {
			if f.Flags&frame.FlagEncrypted == 0 || bytes.Contains(f.Payload, []byte(secretMarker)) {
				r.plaintext.Add(1)
				r.t.Errorf("seed %d: plaintext-at-rest: message %s of the encrypted queue is stored in plaintext", r.seed, f.ID)
			}
			return nil
		})
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// scanSpools reads every file of the run's spool directories and reports
// plaintext of the encrypted queue. It runs while the clients work, since a
// drained spool file is deleted.
func (r *run) scanSpools(ctx context.Context) {
	for ctx.Err() == nil {
		for _, dir := range r.spoolDirs {
			r.scanSpoolDir(dir)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// scanSpoolDir reports the first file of dir holding plaintext of an
// encrypted queue.
func (r *run) scanSpoolDir(dir string) {
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err == nil && bytes.Contains(b, []byte(secretMarker)) {
			if _, seen := r.plainFiles.LoadOrStore(path, true); !seen {
				r.plaintext.Add(1)
				r.t.Errorf("seed %d: plaintext-at-rest: spool file %s holds a payload of the encrypted queue in plaintext", r.seed, path)
			}
			return filepath.SkipAll
		}
		return nil
	})
}

// dumpLog logs the stored messages of a violation's partition, in offset
// order, with the transaction ids that name their pushers.
func (r *run) dumpLog(log []history.Stored, v history.Violation) {
	var ss []history.Stored
	for _, s := range log {
		if s.Queue == v.Queue && s.Partition == v.Partition {
			ss = append(ss, s)
		}
	}
	slices.SortFunc(ss, func(a, b history.Stored) int { return int(a.Offset - b.Offset) })
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, " %d:%s", s.Offset, s.TxID)
	}
	r.t.Logf("    log of %s/%s:%s", v.Queue, v.Partition, b.String())
}

// corrupt overwrites one random segment of the "pause" queue with bytes no
// codec accepts and remembers its messages as destroyed.
func (r *run) corrupt(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, r.url())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	s := pgx.Identifier{r.schema}.Sanitize()
	var pid, base int64
	var pname string
	var blob []byte
	var failures int
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT s.partition_id, s.base_offset, p.name, s.blob, s.failures FROM %[1]s.segments s
		JOIN %[1]s.partitions p ON p.id = s.partition_id JOIN %[1]s.queues q ON q.id = p.queue_id
		WHERE q.name = 'pause' ORDER BY random() LIMIT 1`, s)).Scan(&pid, &base, &pname, &blob, &failures)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	raw, err := segment.Decompress(nil, blob)
	if err != nil {
		return err // already destroyed
	}
	var msgs []history.Stored
	err = frame.Decode(raw, func(k int, f *frame.Frame) error {
		msgs = append(msgs, history.Stored{Queue: "pause", Partition: pname, Offset: base + int64(k), ID: f.ID.String(), TxID: f.TransactionID, Failures: failures})
		return nil
	})
	if err != nil {
		return err
	}
	// Recorded before the write: a write whose reply is lost may have
	// happened.
	r.destroyMu.Lock()
	r.destroyed = append(r.destroyed, msgs...)
	r.destroyMu.Unlock()
	_, err = conn.Exec(ctx, fmt.Sprintf(`UPDATE %s.segments SET blob = $3 WHERE partition_id = $1 AND base_offset = $2`, s), pid, base, corruptBlob)
	return err
}

// corruptBlob is what the nemesis overwrites a segment with: bytes no codec
// accepts.
var corruptBlob = []byte{0xff, 0x00, 0xde, 0xad, 0xbe, 0xef}

func (r *run) isDestroyed(queue, partition string, base int64) bool {
	r.destroyMu.Lock()
	defer r.destroyMu.Unlock()
	for _, d := range r.destroyed {
		if d.Queue == queue && d.Partition == partition && d.Offset == base {
			return true
		}
	}
	return false
}

// The workers of one process share its name, so their transaction ids must
// differ by construction: two of them drawing the same random numbers
// (the suffix is only 1e6 values, and the counters run in step) minted the
// same id for two different items, which a run then reported as one
// transaction stored twice within its dedup window.
func TestWorkersMintDistinctTransactionIDs(t *testing.T) {
	seen := map[string]int{}
	for idx := range 3 {
		w := &worker{proc: "child-1.1", idx: idx, rng: rand.New(rand.NewPCG(7, 7))}
		for range 200 {
			for _, it := range w.items("q") {
				if it.TransactionID == "" {
					continue
				}
				if other, dup := seen[it.TransactionID]; dup && other != idx {
					t.Fatalf("workers %d and %d both minted %q", other, idx, it.TransactionID)
				}
				seen[it.TransactionID] = idx
			}
		}
	}
}
