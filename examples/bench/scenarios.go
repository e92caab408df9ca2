//go:build unix

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

const (
	batchSize   = 1000    // items per push / rows per COPY / jobs per InsertMany
	narrowParts = 100     // partitions of the single and batch scenarios
	wideParts   = 100_000 // partitions of the wide scenario
	payloadSize = 200
)

// makePayloads returns n distinct JSON-like payloads of exactly 200 bytes:
// distinct so that zstd sees realistic, not repeated, input.
func makePayloads(n int) [][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	words := []string{"tea", "cup", "pot", "mug", "leaf", "kettle", "saucer", "spoon", "tray", "jar"}
	out := make([][]byte, n)
	for i := range out {
		s := fmt.Sprintf(`{"event":"order.created","id":%d,"customer":"c-%06d","items":[{"sku":"%s-%02d","qty":%d},{"sku":"%s-%02d","qty":%d}],"token":"%016x","note":"%s"}`,
			1_000_000+r.IntN(9_000_000), r.IntN(1_000_000), words[r.IntN(10)], r.IntN(100), 1+r.IntN(5),
			words[r.IntN(10)], r.IntN(100), 1+r.IntN(5), r.Uint64(), words[r.IntN(10)])
		if len(s) > payloadSize {
			s = s[:payloadSize]
		}
		out[i] = []byte(s + strings.Repeat(" ", payloadSize-len(s)))
	}
	return out
}

func partNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("p%06d", i)
	}
	return out
}

// loadRun is the outcome of a bounded closed-loop load.
type loadRun struct {
	calls   int64
	elapsed time.Duration
	lat     []time.Duration // sorted
	capped  bool
}

// load calls fn from g goroutines until `calls` calls are done or maxTime
// has passed, whichever is first; each call is timed. fn gets the goroutine
// number and a global call index.
func load(ctx context.Context, g int, calls int64, maxTime time.Duration, fn func(g int, i int64) error) (loadRun, error) {
	var (
		next  atomic.Int64
		done  atomic.Int64
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, maxTime)
	defer cancel()
	lats := newLatencies(g, int(calls/int64(g))+1)
	start := time.Now()
	for w := range g {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= calls {
					return
				}
				t := time.Now()
				if err := fn(w, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					cancel()
					return
				}
				lats.add(w, time.Since(t))
				done.Add(1)
			}
		})
	}
	wg.Wait()
	r := loadRun{calls: done.Load(), elapsed: time.Since(start), lat: lats.sorted()}
	r.capped = r.calls < calls
	if first != nil {
		return r, first
	}
	return r, parent.Err()
}

func (lr loadRun) result(name string, per int64, target int64) *result {
	return &result{
		Name:      name,
		Msgs:      lr.calls * per,
		Target:    target,
		Seconds:   lr.elapsed.Seconds(),
		LatencyOf: "call",
		P50ms:     ms(pct(lr.lat, 50)),
		P99ms:     ms(pct(lr.lat, 99)),
		Capped:    lr.capped,
	}
}

func checkPush(res []queen.PushResult, err error) error {
	if err != nil {
		return err
	}
	for i := range res {
		if res[i].Status != queen.Queued {
			return fmt.Errorf("push: item %d: %s: %v", i, res[i].Status, res[i].Err)
		}
	}
	return nil
}

func statsNote(a, b queen.Stats) string {
	c, s, n := b.Commits-a.Commits, b.Segments-a.Segments, b.Items-a.Items
	if c == 0 {
		return ""
	}
	return fmt.Sprintf("%d commits, %.1f segments and %.0f messages per commit", c, float64(s)/float64(c), float64(n)/float64(c))
}

// queenSingle: single-item pushes from 1000 goroutines over 100 partitions.
func (b *bench) queenSingle(ctx context.Context) (*result, error) {
	q := b.client.Queue("single")
	parts := partNames(narrowParts)
	st := b.client.Stats()
	n := int64(b.cfg.nSingle)
	lr, err := load(ctx, 1000, n, b.cfg.maxTime, func(_ int, i int64) error {
		return checkPush(q.Push(ctx, []queen.Item{{Data: b.payloads[i%int64(len(b.payloads))], Partition: parts[i%narrowParts]}}))
	})
	if err != nil {
		return nil, err
	}
	r := lr.result("queen: single-item pushes, 1000 goroutines, 100 partitions", 1, n)
	r.Queen = true
	r.Note = statsNote(st, b.client.Stats())
	return r, nil
}

// pushBatches runs 1000-item pushes from 8 goroutines; part picks the
// partition of item k of call i.
func (b *bench) pushBatches(ctx context.Context, queue string, n int64, part func(i int64, k int) string) (loadRun, string, error) {
	q := b.client.Queue(queue)
	items := make([][]queen.Item, 8)
	for g := range items {
		items[g] = make([]queen.Item, batchSize)
	}
	st := b.client.Stats()
	lr, err := load(ctx, 8, n/batchSize, b.cfg.maxTime, func(g int, i int64) error {
		it := items[g]
		for k := range it {
			it[k] = queen.Item{Data: b.payloads[(i*batchSize+int64(k))%int64(len(b.payloads))], Partition: part(i, k)}
		}
		return checkPush(q.Push(ctx, it))
	})
	return lr, statsNote(st, b.client.Stats()), err
}

// queenBatch: 1000-item pushes of 200-byte payloads from 8 goroutines, each
// push to one of -batch-partitions partitions (100 by default).
func (b *bench) queenBatch(ctx context.Context) (*result, error) {
	np := int64(b.cfg.batchParts)
	parts := partNames(int(np))
	n := int64(b.cfg.nBatch)
	lr, note, err := b.pushBatches(ctx, "batch", n, func(i int64, _ int) string { return parts[(i*7919)%np] })
	if err != nil {
		return nil, err
	}
	r := lr.result(fmt.Sprintf("queen: 1000-item pushes (200 B), 8 goroutines, %s partition%s", fmtInt(float64(np)), plural(int(np))), batchSize, n)
	r.Queen, r.Note = true, note
	b.queenBacklog = r.Msgs
	return r, nil
}

// queenMixed: 1000-item pushes whose items spread over the 100 partitions,
// 10 to each per call (mixed keys in one call), 8 goroutines.
func (b *bench) queenMixed(ctx context.Context) (*result, error) {
	parts := partNames(narrowParts)
	n := int64(b.cfg.nBatch)
	lr, note, err := b.pushBatches(ctx, "mixed", n, func(_ int64, k int) string { return parts[k%narrowParts] })
	if err != nil {
		return nil, err
	}
	r := lr.result("queen: 1000-item pushes (200 B), 8 goroutines, 10 items to each of 100 partitions per call", batchSize, n)
	r.Queen, r.Note = true, note
	return r, nil
}

// copyOne: one COPY of 500,000 rows into an unindexed table.
func (b *bench) copyOne(ctx context.Context) (*result, error) {
	if _, err := b.base.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS bench_base; CREATE TABLE bench_base.copy_one (id bigint, data bytea)"); err != nil {
		return nil, err
	}
	const rows = 500_000
	cols := []string{"id", "data"}
	table := pgx.Identifier{"bench_base", "copy_one"}
	lr, err := load(ctx, 1, 1, b.cfg.maxTime, func(int, int64) error {
		_, err := b.base.CopyFrom(ctx, table, cols, pgx.CopyFromSlice(rows, func(k int) ([]any, error) {
			return []any{int64(k), b.payloads[k%len(b.payloads)]}, nil
		}))
		return err
	})
	if err != nil {
		return nil, err
	}
	return lr.result("baseline: one COPY of 500,000 rows, unindexed table", rows, rows), nil
}

// queenWide: the same pushes spread over 100,000 partitions. Each push
// covers 1000 consecutive partitions (one item each), so every partition
// is written every 100 pushes and a run touches all of them.
func (b *bench) queenWide(ctx context.Context) (*result, error) {
	parts := partNames(wideParts)
	n := int64(b.cfg.nWide)
	lr, note, err := b.pushBatches(ctx, "wide", n, func(i int64, k int) string {
		return parts[(i*batchSize+int64(k))%wideParts]
	})
	if err != nil {
		return nil, err
	}
	r := lr.result("queen: 1000-item pushes (200 B), 8 goroutines, 100,000 partitions", batchSize, n)
	r.Queen, r.Note = true, note
	return r, nil
}

// insertBaseline: single-row INSERT commits from 64 connections into an
// unindexed table.
func (b *bench) insertBaseline(ctx context.Context) (*result, error) {
	if _, err := b.base.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS bench_base; CREATE TABLE bench_base.insert_rows (id bigint, data bytea)"); err != nil {
		return nil, err
	}
	n := int64(b.cfg.nSingle)
	lr, err := load(ctx, 64, n, b.cfg.maxTime, func(_ int, i int64) error {
		_, err := b.base.Exec(ctx, "INSERT INTO bench_base.insert_rows (id, data) VALUES ($1, $2)", i, b.payloads[i%int64(len(b.payloads))])
		return err
	})
	if err != nil {
		return nil, err
	}
	return lr.result("baseline: single-row INSERT commits, 64 connections", 1, n), nil
}

// insertOneCalls is how many commits insertOne times: enough for a stable
// p50, short beside the end-to-end scenarios it is the yardstick of.
const insertOneCalls = 2000

// insertOne: single-row INSERT commits from one connection, one at a time:
// what one commit costs on this server at this moment, the yardstick of
// the end-to-end latency at a low rate (each message there is a few
// commits in a row).
func (b *bench) insertOne(ctx context.Context) (*result, error) {
	if _, err := b.base.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS bench_base; CREATE TABLE IF NOT EXISTS bench_base.insert_one (id bigint, data bytea)"); err != nil {
		return nil, err
	}
	lr, err := load(ctx, 1, insertOneCalls, b.cfg.maxTime, func(_ int, i int64) error {
		_, err := b.base.Exec(ctx, "INSERT INTO bench_base.insert_one (id, data) VALUES ($1, $2)", i, b.payloads[i%int64(len(b.payloads))])
		return err
	})
	if err != nil {
		return nil, err
	}
	return lr.result("baseline: single-row INSERT commits, 1 connection, one at a time", 1, insertOneCalls), nil
}

// insertPacedRate is the rate insertPaced offers: the lowest end-to-end
// rate, the one whose latency an INSERT commit is the yardstick of (one
// connection could not keep up with the higher ones).
func (b *bench) insertPacedRate() int {
	r := 0
	for _, c := range b.cfg.e2eCases {
		if r == 0 || c.rate < r {
			r = c.rate
		}
	}
	return r
}

// insertPaced: single-row INSERT commits from one connection, offered by the
// end-to-end scenarios' open loop (openLoop: the same sleeps, the same
// senders) at the lowest end-to-end rate, for
// -e2e-time. insertOne runs its commits back to back; here, as in the
// end-to-end scenario at a low rate, the client and the server are idle
// between commits, and each commit pays for waking them.
func (b *bench) insertPaced(ctx context.Context) (*result, error) {
	rate := b.insertPacedRate()
	total := int64(float64(rate) * b.cfg.e2eDur.Seconds())
	name := fmt.Sprintf("baseline: single-row INSERT commits, 1 connection, paced at %s/s", fmtInt(float64(rate)))
	if rate == 0 || total <= 0 {
		return &result{Name: name, Unavailable: "no end-to-end rate (-e2e) or -e2e-time is zero"}, nil
	}
	if _, err := b.base.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS bench_base; CREATE TABLE IF NOT EXISTS bench_base.insert_paced (id bigint, data bytea)"); err != nil {
		return nil, err
	}
	conn, err := b.base.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	// Warm the connection's statement cache, as insertOne's first calls do.
	if _, err := conn.Exec(ctx, "INSERT INTO bench_base.insert_paced (id, data) VALUES ($1, $2)", int64(-1), b.payloads[0]); err != nil {
		return nil, err
	}
	// One connection: a send that starts while another is late waits for
	// it. The latency is the INSERT's own, without that wait (a commit's
	// cost, as insertOne's); the note's scheduled-time figure includes it.
	var mu sync.Mutex
	var lats []time.Duration
	rec := newE2ERecorder(total)
	start := time.Now()
	_, err = openLoop(ctx, rate, rec, start, func(seq, _ int64) error {
		mu.Lock()
		defer mu.Unlock()
		t := time.Now()
		_, err := conn.Exec(ctx, "INSERT INTO bench_base.insert_paced (id, data) VALUES ($1, $2)", seq, b.payloads[seq%int64(len(b.payloads))])
		lats = append(lats, time.Since(t))
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(lats)
	callLat := lats
	el := time.Since(start)
	// From the scheduled time, as the end-to-end latency counts: the open
	// loop's own lateness included.
	interval := time.Second / time.Duration(rate)
	var fromSched []time.Duration
	for i, t := range rec.sent {
		if t != 0 {
			fromSched = append(fromSched, time.Duration(t-start.Add(time.Duration(i)*interval).UnixNano()))
		}
	}
	slices.Sort(fromSched)
	return &result{
		Name: name, Msgs: int64(len(callLat)), Target: total, Seconds: el.Seconds(), Capped: int64(len(callLat)) < total,
		LatencyOf: "call", P50ms: ms(pct(callLat, 50)), P99ms: ms(pct(callLat, 99)), PacedAt: float64(rate),
		Note: fmt.Sprintf("scheduled time → INSERT returned: p50 %s, p99 %s", fmtMs(ms(pct(fromSched, 50))), fmtMs(ms(pct(fromSched, 99)))),
	}, nil
}

// copyBaseline: COPY of 1000 rows per call from 8 goroutines into an
// unindexed table.
func (b *bench) copyBaseline(ctx context.Context) (*result, error) {
	if _, err := b.base.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS bench_base; CREATE TABLE bench_base.copy_rows (id bigint, data bytea)"); err != nil {
		return nil, err
	}
	n := int64(b.cfg.nBatch)
	cols := []string{"id", "data"}
	table := pgx.Identifier{"bench_base", "copy_rows"}
	lr, err := load(ctx, 8, n/batchSize, b.cfg.maxTime, func(_ int, i int64) error {
		base := i * batchSize
		_, err := b.base.CopyFrom(ctx, table, cols, pgx.CopyFromSlice(batchSize, func(k int) ([]any, error) {
			id := base + int64(k)
			return []any{id, b.payloads[id%int64(len(b.payloads))]}, nil
		}))
		return err
	})
	if err != nil {
		return nil, err
	}
	return lr.result("baseline: COPY 1000 rows, 8 goroutines, unindexed table", batchSize, n), nil
}
