package history_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// spoolWin is the "spoolwin" generator: in each maintenance window of the
// nemesis a client of its own, opened at the run's start (its spool among
// the scanned ones), makes the pushes that only a window makes possible,
// on fresh queues:
//   - sw-enc-N, encrypted before this client ever saw it: a push whose
//     settings are not cached must still reach the spool sealed;
//   - sw-turn-N, which this client caches as plain before another client
//     makes it encrypted: pushed in the window, then again every few
//     milliseconds from the moment the window ends, the first of which go
//     behind the partition's spooled items, before the drain; all sealed;
//   - sw-lanes-N, with Lanes a and nothing keyed stored: a keyed push of
//     key K and one call of two items sharing a transaction id whose keys
//     share a lane under a but not under b (a layer-1 leader and follower),
//     both spooled; then this client sets Lanes b (forgetting its cached
//     count) and, from the window's end, pushes K again every few
//     milliseconds: none may be stored before the spooled one, and the
//     follower, reported Buffered, must be stored in its own lane.
//
// Its spool is scanned for plaintext right after each Buffered push (the
// drain may delete the file before scanSpools comes by). Pushes are
// recorded once the window's sequence ends: where a spooled keyed item is
// stored depends on the lane count at its replay, known only then.
type spoolWin struct {
	r     *run
	c     *queen.Client
	admin *queen.Client
	dir   string
	rng   *rand.Rand      // guarded by the nemesis: only window draws
	stop  context.Context // the run's generation
	n     int             // windows begun (the nemesis's goroutine only)
	seq   atomic.Int64
}

const swProc = "spoolwin"

// openSpoolWin opens the generator's client; it must run before scanSpools
// starts, which reads r.spoolDirs.
func (r *run) openSpoolWin(ctx, stop context.Context, admin *queen.Client) *spoolWin {
	dir := r.t.TempDir()
	r.spoolDirs = append(r.spoolDirs, dir)
	s := &spoolWin{r: r, admin: admin, dir: dir, c: r.open(ctx, swProc, dir), rng: rand.New(rand.NewPCG(r.seed, 0x5700)), stop: stop}
	// Above the recorder's own numbering of this proc (its client's log).
	s.seq.Store(1 << 40)
	return s
}

// window starts the generator's sequence for a maintenance window the
// nemesis has just opened and returns once the pushes that must be spooled
// in the window are made (or after 10 s): the nemesis ends the window after.
func (s *spoolWin) window() {
	if s == nil {
		return
	}
	s.n++
	counts := []int{2, 3, 4, 8}
	a := counts[s.rng.IntN(len(counts))]
	b := counts[s.rng.IntN(len(counts))]
	for a%b == 0 {
		b = counts[s.rng.IntN(len(counts))]
	}
	ready := make(chan struct{})
	n := s.n
	s.r.bg.Go(func() { s.run(n, a, b, ready) })
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
	}
}

// swPush is one push of the sequence, recorded at the end.
type swPush struct {
	q      string
	items  []queen.Item
	t0, t1 int64
	res    []queen.PushResult
	err    error
}

func (s *spoolWin) push(ctx context.Context, q string, items []queen.Item) *swPush {
	p := &swPush{q: q, items: items, t0: time.Now().UnixNano()}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	p.res, p.err = s.c.Queue(q).Push(pctx, items)
	cancel()
	p.t1 = time.Now().UnixNano()
	for _, r := range p.res {
		if r.Status == queen.Buffered {
			s.r.scanSpoolDir(s.dir)
			break
		}
	}
	return p
}

// waitUntil polls cond until it holds (true) or d passed (false).
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

func (s *spoolWin) run(n, a, b int, ready chan struct{}) {
	var once sync.Once
	spooled := func() { once.Do(func() { close(ready) }) }
	defer spooled()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var ops []*swPush
	lanes := map[string]int{}
	defer func() { s.record(ops, lanes) }()
	add := func(p *swPush) *swPush {
		mu.Lock()
		defer mu.Unlock()
		ops = append(ops, p)
		return p
	}
	buffered := func(p *swPush) bool {
		return p.err == nil && len(p.res) > 0 && p.res[0].Status == queen.Buffered
	}
	if !waitUntil(3*time.Second, s.c.Maintenance) {
		return // this client did not see the window open
	}
	opts := func(o queen.QueueOptions) queen.QueueOptions {
		o.DedupWindow, o.RetryLimit, o.DeadLetter, o.LeaseTime = time.Hour, 2, true, time.Second
		return o
	}
	info := func(enc bool) history.QueueInfo {
		return history.QueueInfo{Deduped: true, Groups: []string{""}, DeadLetter: true, Encrypted: enc}
	}
	secret := func(tx string) queen.Item {
		return queen.Item{Partition: "p", TransactionID: tx, Data: []byte(secretMarker + tx)}
	}
	enc := fmt.Sprintf("sw-enc-%d", n)
	if s.admin.Queue(enc).Configure(ctx, opts(queen.QueueOptions{Encryption: true})) == nil {
		s.r.addQueue(enc, info(true))
		add(s.push(ctx, enc, []queen.Item{secret(enc + "/0")}))
	}
	turn := fmt.Sprintf("sw-turn-%d", n)
	// Its window from before its first push, as the other two queues'. A
	// Buffered push whose commit's reply was lost (the flush's timeout
	// racing its commit, more likely on the Citus layout, where creating a
	// queue is a two-phase commit) is stored again by its replay, which
	// only a window absorbs: one set after the first push, by the
	// Configure below, does not cover a replay that ran before it.
	tinfo := info(true)
	if s.admin.Queue(turn).Configure(ctx, opts(queen.QueueOptions{})) != nil {
		tinfo.Deduped = false
	}
	s.r.addQueue(turn, tinfo)
	first := add(s.push(ctx, turn, []queen.Item{{Partition: "p", TransactionID: turn + "/0", Data: payload(turn, turn+"/0")}}))
	turned := buffered(first) && s.admin.Queue(turn).Configure(ctx, opts(queen.QueueOptions{Encryption: true})) == nil
	if turned {
		add(s.push(ctx, turn, []queen.Item{secret(turn + "/1")}))
	}
	lq := fmt.Sprintf("sw-lanes-%d", n)
	key := fmt.Sprintf("k%d", n)
	keyed := false
	if s.admin.Queue(lq).Configure(ctx, opts(queen.QueueOptions{Lanes: a})) == nil {
		s.r.addQueue(lq, info(false))
		lanes[lq] = a
		k0 := add(s.push(ctx, lq, []queen.Item{{TransactionID: lq + "/0", Key: key, Data: payload(lq, lq+"/0")}}))
		ka, kb := lanePair(n, a, b)
		tx := lq + "/pair"
		add(s.push(ctx, lq, []queen.Item{{TransactionID: tx, Key: ka, Data: payload(lq, tx)}, {TransactionID: tx, Key: kb, Data: payload(lq, tx)}}))
		// This client's Configure forgets its cached count: its next
		// pushes route K under b while the spooled K waits under a.
		for ctx.Err() == nil {
			err := s.c.Queue(lq).Configure(ctx, opts(queen.QueueOptions{Lanes: b}))
			if err == nil {
				lanes[lq] = b
				break
			}
			if errors.Is(err, queen.ErrLanesFixed) {
				break // a keyed message is stored: the count stayed a
			}
			time.Sleep(50 * time.Millisecond)
		}
		add(s.push(ctx, lq, []queen.Item{{Partition: "p", TransactionID: lq + "/p", Data: payload(lq, lq+"/p")}}))
		keyed = buffered(k0)
	}
	spooled()
	if !turned && !keyed {
		return
	}
	// The nemesis's window may outlive the run: heal ends it, after this.
	if !waitUntil(30*time.Second, func() bool { return !s.c.Maintenance() || s.stop.Err() != nil }) || s.c.Maintenance() {
		return
	}
	// From the window's end: behind the spooled items, then past the drain.
	end := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	repeat := func(q string, item func(j int) queen.Item) {
		wg.Go(func() {
			for j := 0; time.Now().Before(end) && ctx.Err() == nil; j++ {
				add(s.push(ctx, q, []queen.Item{item(j)}))
				time.Sleep(30 * time.Millisecond)
			}
		})
	}
	if turned {
		repeat(turn, func(j int) queen.Item { return secret(fmt.Sprintf("%s/after%d", turn, j)) })
	}
	if keyed {
		repeat(lq, func(j int) queen.Item {
			tx := fmt.Sprintf("%s/after%d", lq, j)
			return queen.Item{TransactionID: tx, Key: key, Data: payload(lq, tx)}
		})
	}
	wg.Wait()
}

// record adds the sequence's pushes to the history, a keyed item in its
// key's lane under its queue's final count.
func (s *spoolWin) record(ops []*swPush, lanes map[string]int) {
	for _, p := range ops {
		hs := histItems(p.items)
		for i, it := range p.items {
			if it.Key != "" && it.Partition == "" {
				hs[i].Partition = laneOf(it.Key, lanes[p.q])
			}
		}
		seq := s.seq.Add(1)
		s.r.rec.Add(history.Event{Proc: swProc, Seq: seq, Op: history.OpPush, Phase: history.Invoke, T: p.t0, Queue: p.q, Items: hs})
		done := history.Event{Proc: swProc, Seq: seq, Op: history.OpPush, Phase: history.OK, T: p.t1, Queue: p.q}
		if p.err != nil {
			done.Phase, done.Err = history.Info, p.err.Error()
		} else {
			done.Results, done.ItemErr = histResults(p.res), itemErr(p.res)
		}
		s.r.rec.Add(done)
	}
}

// ownWindow is a maintenance window of the generator's own, for a run whose
// nemesis drew none (a run of a few slow faults).
func (s *spoolWin) ownWindow(ctx context.Context, admin *queen.Client) error {
	s.r.maintMu.RLock()
	defer s.r.maintMu.RUnlock()
	if err := admin.SetMaintenance(ctx, true); err != nil {
		return err
	}
	s.window()
	time.Sleep(time.Duration(400+s.rng.IntN(400)) * time.Millisecond)
	// Off even if the run ended meanwhile: the sequence waits for it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := admin.SetMaintenance(context.Background(), false)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
