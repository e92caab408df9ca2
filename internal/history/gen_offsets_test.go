package history_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// The "offsets" generator: an operator moves the cursors of two groups of a
// queue of its own (ResetGroup of each kind, Force or not, some on a subset
// of the partitions; DeleteGroup; ReleaseLease of a partition a consumer
// holds; and calls naming a partition or group that does not exist) while
// a producer pushes and each group has a Pop consumer and a Consume
// reading. check_offsets.go judges what each move skipped or replayed.
const (
	offsetsQueue = "offsets"
	offsetsProc  = "offsets"
)

var (
	offsetsGroups = []string{"oa", "ob"}
	offsetsParts  = []string{"p0", "p1", "p2"}
)

// offsetsLease is the lease of the offsets queue's consumers: short, so
// one a consumer abandons (its settle refused) ends well before the final
// drain.
const offsetsLease = 800 * time.Millisecond

// offsetsInfo is the offsets queue as the checker knows it.
func offsetsInfo() history.QueueInfo {
	return history.QueueInfo{Deduped: true, Moved: offsetsGroups, LeaseTime: int64(offsetsLease)}
}

// held is which partitions the Pop consumers hold a lease on, per group:
// the operator releases one of them.
type held struct {
	mu sync.Mutex
	m  map[string]map[string]int // group -> partition -> holders
}

func (h *held) add(g, p string, d int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m[g] == nil {
		h.m[g] = map[string]int{}
	}
	h.m[g][p] += d
}

func (h *held) pick(rng *rand.Rand, g string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ps []string
	for _, p := range offsetsParts {
		if h.m[g][p] > 0 {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return offsetsParts[rng.IntN(len(offsetsParts))]
	}
	return ps[rng.IntN(len(ps))]
}

// offsets runs the generator on client c until ctx ends.
func (r *run) offsets(ctx context.Context, c *queen.Client) {
	q := c.Queue(offsetsQueue)
	// Retried through an outage: the checker takes the queue as deduped.
	for q.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, LeaseTime: offsetsLease}) != nil {
		if sleepCtx(ctx, 100*time.Millisecond); ctx.Err() != nil {
			return
		}
	}
	r.addQueue(offsetsQueue, offsetsInfo())
	w := &worker{c: c, rec: r.rec, proc: offsetsProc, rng: rand.New(rand.NewPCG(r.seed, 0x0ff5)), r: r}
	var n atomic.Int64
	// quiet: the operator holds it to make a move while no push is in
	// flight, which pins where "latest" and "time" must land exactly.
	var quiet sync.RWMutex
	push := func(p string) bool {
		quiet.RLock()
		defer quiet.RUnlock()
		tx := fmt.Sprintf("%s/%d", offsetsQueue, n.Add(1)-1)
		return w.pushOwn(ctx, offsetsQueue, []queen.Item{{Partition: p, TransactionID: tx, Data: payload(offsetsQueue, tx)}})
	}
	// Every partition exists before the operator starts: a reset moves
	// only partitions that exist. Pushed again through an outage (a
	// Buffered push makes its partition only when replayed).
	for _, p := range offsetsParts {
		for !push(p) {
			if sleepCtx(ctx, 100*time.Millisecond); ctx.Err() != nil {
				return // the final drain reads what was spooled
			}
		}
	}
	var wg sync.WaitGroup
	h := &held{m: map[string]map[string]int{}}
	wg.Go(func() {
		for ctx.Err() == nil {
			push(offsetsParts[w.rng.IntN(len(offsetsParts))])
			sleepCtx(ctx, time.Duration(10+w.rng.IntN(40))*time.Millisecond)
		}
	})
	for i, g := range offsetsGroups {
		pw := &worker{c: c, rec: r.rec, proc: offsetsProc, rng: rand.New(rand.NewPCG(r.seed, 0x0ff6+uint64(i)))}
		wg.Go(func() { pw.offsetsPops(ctx, q, g, h) })
		cw := &worker{c: c, rec: r.rec, proc: offsetsProc, rng: rand.New(rand.NewPCG(r.seed, 0x0ff8+uint64(i)))}
		wg.Go(func() { cw.offsetsConsume(ctx, q, g) })
	}
	ow := &worker{c: c, rec: r.rec, proc: offsetsProc, rng: rand.New(rand.NewPCG(r.seed, 0x0ffa)), r: r}
	wg.Go(func() { ow.offsetsOperator(ctx, q, h, &n, &quiet) })
	wg.Wait()
	var calls []string
	for _, k := range []string{"reset", "delete-group", "release"} {
		calls = append(calls, fmt.Sprintf("%d %s (%d applied, %d refused as active, %d as not found)", ow.moving[k+"/"], k,
			ow.moving[k+"/ok"], ow.moving[k+"/active"], ow.moving[k+"/not-found"]))
	}
	r.t.Logf("offsets: %d pushed; %s; %d leases released", n.Load(), strings.Join(calls, ", "), ow.moving["released"])
}

// offsetsPops pops as group g and holds each batch a while before acking
// it (each message, or only the last), so that the operator's release or
// forced move meets held leases.
func (w *worker) offsetsPops(ctx context.Context, q *queen.Queue, g string, h *held) {
	for ctx.Err() == nil {
		o := queen.PopOptions{Group: g, Batch: 1 + w.rng.IntN(5), LeaseTime: offsetsLease, Wait: 100 * time.Millisecond}
		msgs := recordPop(ctx, w.rec, w.proc, q, o)
		if len(msgs) == 0 {
			sleepCtx(ctx, 20*time.Millisecond)
			continue
		}
		p := msgs[0].Partition
		h.add(g, p, 1)
		sleepCtx(ctx, time.Duration(w.rng.IntN(200))*time.Millisecond)
		if w.rng.IntN(2) == 0 {
			_ = recordSettle(ctx, w.rec, w.proc, msgs[len(msgs)-1], "ack", w.rng)
		} else {
			for _, m := range msgs {
				if recordSettle(ctx, w.rec, w.proc, m, "ack", w.rng) != nil {
					break
				}
			}
		}
		h.add(g, p, -1)
	}
}

// offsetsConsume runs Consume calls of 0.5-2 s as group g: a live member
// (and its leases) while it runs, none between calls.
func (w *worker) offsetsConsume(ctx context.Context, q *queen.Queue, g string) {
	for ctx.Err() == nil {
		o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: g, Batch: 1 + w.rng.IntN(5), LeaseTime: offsetsLease, Wait: 100 * time.Millisecond}}
		cctx, cancel := context.WithTimeout(ctx, time.Duration(500+w.rng.IntN(1500))*time.Millisecond)
		_ = q.Consume(cctx, o, func(hctx context.Context, m *queen.Message) error {
			inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpHandler, Queue: q.Name(), Group: m.Group,
				Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}})
			sleepCtx(hctx, time.Duration(w.rng.IntN(30))*time.Millisecond)
			w.rec.Done(inv, history.OK, history.Event{})
			return nil
		})
		cancel()
		sleepCtx(ctx, time.Duration(w.rng.IntN(500))*time.Millisecond)
	}
}

// offsetsOperator calls ResetGroup, DeleteGroup and ReleaseLease at random
// moments. A group never reset since its creation (at the start, or after
// a delete) is first reset to earliest or to offsets, on every partition:
// a reset subscribes a group with no subscription (latest: SubscribeNew,
// time: SubscribeFrom), which would then start the partitions it did not
// move where the checker's model (SubscribeAll) does not.
func (w *worker) offsetsOperator(ctx context.Context, q *queen.Queue, h *held, pushed *atomic.Int64, quiet *sync.RWMutex) {
	fresh := map[string]bool{}
	for _, g := range offsetsGroups {
		fresh[g] = true
	}
	sleepCtx(ctx, 300*time.Millisecond)
	for ctx.Err() == nil {
		sleepCtx(ctx, time.Duration(30+w.rng.IntN(120))*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
		g := offsetsGroups[w.rng.IntN(len(offsetsGroups))]
		// Each call runs to its end: one cut short by the run's end has an
		// unknown outcome, which leaves its group's last era unjudged.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		switch x := w.rng.IntN(100); {
		case x < 40:
			// Half the resets with no push in flight.
			still := w.rng.IntN(2) == 0
			if still {
				quiet.Lock()
			}
			if w.offsetsReset(ctx, q, g, fresh[g], false, pushed) {
				fresh[g] = false
			}
			if still {
				quiet.Unlock()
			}
		case x < 55:
			if w.offsetsDelete(ctx, q, g, w.rng.IntN(3) != 0, false) {
				fresh[g] = true
			}
		case x < 88:
			w.offsetsRelease(ctx, q, g, h.pick(w.rng, g), false)
		case x < 93:
			w.offsetsReset(ctx, q, g, false, true, pushed)
		case x < 97:
			w.offsetsDelete(ctx, q, "ghost", w.rng.IntN(2) == 0, true)
		default:
			w.offsetsRelease(ctx, q, g, "nope", true)
		}
		cancel()
	}
}

// refusal names a refused call's sentinel, or "unsent" for a call whose
// statement never reached the server ("" for any other error).
func refusal(err error) string {
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &ce), pgconn.SafeToRetry(err):
		return "unsent"
	case errors.Is(err, queen.ErrGroupActive):
		return "active"
	case errors.Is(err, queen.ErrNotFound):
		return "not-found"
	}
	return ""
}

// doneMoving completes a moving call: Fail for a refusal or a call never
// sent (it changed nothing), Info for any other error.
func (w *worker) doneMoving(inv history.Event, err error, res history.Event) {
	if w.moving == nil {
		w.moving = map[string]int{}
	}
	w.moving[inv.Kind+"/"]++
	w.moving[inv.Kind+"/"+refusal(err)]++
	if err == nil {
		w.moving[inv.Kind+"/ok"]++
	}
	if res.Released {
		w.moving["released"]++
	}
	switch {
	case err == nil:
		w.rec.Done(inv, history.OK, res)
	case refusal(err) != "":
		w.rec.Done(inv, history.Fail, history.Event{Err: err.Error(), Refusal: refusal(err)})
	default:
		w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		if w.moving["info"]++; w.moving["info"] <= 3 {
			w.r.t.Logf("offsets: %s of %q: %v", inv.Kind, inv.Group, err)
		}
	}
}

// offsetsReset resets group g (absent: naming a partition that does not
// exist too) and reports whether it applied.
func (w *worker) offsetsReset(ctx context.Context, q *queen.Queue, g string, fresh, absent bool, pushed *atomic.Int64) bool {
	kinds := []string{"earliest", "latest", "time", "offsets"}
	if fresh {
		kinds = []string{"earliest", "offsets"}
	}
	inv := history.Event{Proc: w.proc, Op: history.OpCall, Kind: "reset", Queue: q.Name(), Group: g, Reset: kinds[w.rng.IntN(len(kinds))],
		Force: w.rng.IntN(3) != 0, Absent: absent}
	var to queen.ResetTo
	var o queen.ResetOptions
	o.Force = inv.Force
	if !fresh && w.rng.IntN(3) == 0 {
		for _, p := range offsetsParts {
			if w.rng.IntN(2) == 0 {
				o.Partitions = append(o.Partitions, p)
			}
		}
	}
	if absent {
		o.Partitions = append(o.Partitions, "nope")
	}
	switch inv.Reset {
	case "earliest":
		to = queen.ResetEarliest()
	case "latest":
		to = queen.ResetLatest()
	case "time":
		// Within the last second or so: some messages before, some after.
		// Whole microseconds, as the database stores times.
		t := time.Now().Add(-time.Duration(w.rng.IntN(1500)) * time.Millisecond).Truncate(time.Microsecond)
		inv.At = t.UnixNano()
		to = queen.ResetToTime(t)
	case "offsets":
		inv.Want = map[string]int64{}
		parts := offsetsParts
		if !fresh && w.rng.IntN(2) == 0 {
			parts = []string{offsetsParts[w.rng.IntN(len(offsetsParts))]}
		}
		for _, p := range parts {
			// Up to a little past the partition's tail (clamped).
			inv.Want[p] = int64(w.rng.IntN(int(pushed.Load())/len(offsetsParts) + 4))
		}
		if absent {
			inv.Want["nope"] = 0
		}
		to = queen.ResetToOffsets(inv.Want)
	}
	inv.Parts = slices.Clone(o.Partitions)
	inv = w.rec.Invoke(inv)
	mv, err := q.ResetGroup(ctx, g, to, o)
	res := history.Event{}
	for _, m := range mv {
		res.Moves = append(res.Moves, history.Move{Partition: m.Partition, Before: m.Before, After: m.After, Created: m.Created, LeaseEnded: m.LeaseEnded})
	}
	w.doneMoving(inv, err, res)
	return err == nil
}

// offsetsDelete deletes group g and reports whether it may have applied.
func (w *worker) offsetsDelete(ctx context.Context, q *queen.Queue, g string, force, absent bool) bool {
	inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "delete-group", Queue: q.Name(), Group: g, Force: force, Absent: absent})
	d, err := q.DeleteGroup(ctx, g, queen.DeleteGroupOptions{Force: force})
	w.doneMoving(inv, err, history.Event{Ended: d.LeasesEnded})
	return err == nil || refusal(err) == ""
}

// offsetsRelease releases group g's lease on partition p.
func (w *worker) offsetsRelease(ctx context.Context, q *queen.Queue, g, p string, absent bool) {
	inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "release", Queue: q.Name(), Group: g, Partition: p, Absent: absent})
	ok, err := q.ReleaseLease(ctx, g, p)
	w.doneMoving(inv, err, history.Event{Released: ok})
}
