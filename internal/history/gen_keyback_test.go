package history_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// The "keyback" generator: failures on queues with a long RetryBackoff
// where a failed message may hold back nothing else (check_keyback.go
// judges what it records): a keyed queue consumed with KeyConcurrency, and
// a FailureSkip queue.
const (
	kbKeyedQueue = "kbkeyed"
	kbSkipQueue  = "kbskip"
	// kbWait is both queues' RetryBackoff (Min = Max): a failure that held
	// its lane or partition back would hold it this long, past holdBound.
	kbWait = 5 * time.Second
	// kbLease keeps what a lost settle or a batch may hold under
	// holdBound, and outlasts a settle under load.
	kbLease = 2 * time.Second
)

// startKeyBack starts the generator's producers and consumers on c (a
// client of its own), one Consume per queue for the whole run
// (check_keyback.go judges a message only while one runs), and on the
// skip queue a Pop consumer as well.
func (r *run) startKeyBack(genCtx context.Context, wg *sync.WaitGroup, c *queen.Client) {
	if !r.gen["keyback"] {
		return
	}
	mk := func(idx int, stream uint64) *worker {
		return &worker{c: c, rec: r.rec, proc: "keyback", idx: idx, rng: rand.New(rand.NewPCG(r.seed, stream)), from: r.from, gen: r.gen, r: r}
	}
	base := queen.QueueOptions{RetryLimit: 3, DeadLetter: true, LeaseTime: kbLease, RetryBackoff: queen.RetryBackoff{Min: kbWait, Max: kbWait}}
	kw, kp := mk(0, 0x6b6b), mk(1, 0x6b6c)
	if err := kw.c.Queue(kbKeyedQueue).Configure(genCtx, base); err == nil {
		// Its failures wait kbWait too, each message alone (per-key
		// Consume under FailurePause): retry-early judges them.
		r.addQueue(kbKeyedQueue, history.QueueInfo{Groups: []string{""}, DeadLetter: true, HoldWait: kbWait,
			RetryMin: kbWait})
		keys := laneKeys(4)
		wg.Go(func() { kp.kbProduce(genCtx, kbKeyedQueue, keys) })
		wg.Go(func() { kw.kbConsume(genCtx, kbKeyedQueue, 2+kw.rng.IntN(3), keys[0]) })
	}
	skip := base
	skip.FailurePolicy = queen.FailureSkip
	sw, sp, spop := mk(2, 0x5b5b), mk(3, 0x5b5c), mk(4, 0x5b5d)
	if err := sw.c.Queue(kbSkipQueue).Configure(genCtx, skip); err == nil {
		// Its failures wait kbWait (the backoff and every RetryAfter):
		// retry-early judges the copies.
		r.addQueue(kbSkipQueue, history.QueueInfo{Groups: []string{""}, DeadLetter: true, HoldWait: kbWait, Skip: true,
			RetryMin: kbWait})
		wg.Go(func() { sp.kbProduce(genCtx, kbSkipQueue, nil) })
		wg.Go(func() { sw.kbConsume(genCtx, kbSkipQueue, 1, "") })
		wg.Go(func() { spop.kbPops(genCtx) })
	}
}

// laneKeys returns n keys that share one lane under the default lane
// count (histItems' rule): the first is the one that fails.
func laneKeys(n int) []string {
	by := map[uint64][]string{}
	for i := 0; ; i++ {
		k := fmt.Sprintf("kb%d", i)
		l := xxh3.HashString(k) % queen.DefaultLanes
		by[l] = append(by[l], k)
		if len(by[l]) == n {
			return by[l]
		}
	}
}

// kbProduce pushes one item every 150-300 ms: to keys (an eighth of them
// to the first, whose failures each wait kbWait, so it builds a backlog
// that its lane's other keys must get past) or, without keys, to
// partitions q0 and q1.
func (w *worker) kbProduce(ctx context.Context, q string, keys []string) {
	n := 0
	defer func() { w.r.t.Logf("keyback: %s: %d pushed", q, n) }()
	for ctx.Err() == nil {
		items := make([]queen.Item, 1)
		for i := range items {
			n++
			tx := fmt.Sprintf("%s-%d", q, n)
			items[i] = queen.Item{TransactionID: tx, Data: payload(q, tx)}
			switch {
			case keys == nil:
				items[i].Partition = fmt.Sprintf("q%d", w.rng.IntN(2))
			case w.rng.IntN(8) == 0:
				items[i].Key = keys[0]
			default:
				items[i].Key = keys[1+w.rng.IntN(len(keys)-1)]
			}
		}
		w.pushOwn(ctx, q, items)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(150+w.rng.IntN(150)) * time.Millisecond):
		}
	}
}

// kbConsume runs one Consume until ctx ends, recorded as a "consume"
// call. Its handler fails the first attempt of sick's messages (of every
// message a third of the time when sick is ""), and a later attempt a
// quarter of the time, half of them with queen.RetryAfter; it acks the
// rest.
func (w *worker) kbConsume(ctx context.Context, q string, keyConc int, sick string) {
	o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 4 + w.rng.IntN(5), LeaseTime: kbLease, Wait: 200 * time.Millisecond},
		Concurrency: 2, KeyConcurrency: keyConc}
	call := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "consume", Queue: q, Keyed: keyConc > 1, Batch: o.Batch})
	var mu sync.Mutex // the handlers' draws
	handled, fails := 0, 0
	start := time.Now()
	err := w.c.Queue(q).Consume(ctx, o, func(_ context.Context, m *queen.Message) error {
		h := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpHandler, Queue: q, Group: m.Group,
			Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}, Keys: []string{m.Key},
			BadData: badData(m)})
		mu.Lock()
		fail := m.Attempt > 1 && w.rng.IntN(4) == 0
		if m.Attempt == 1 {
			fail = sick != "" && m.Key == sick || sick == "" && w.rng.IntN(3) == 0
		}
		after := w.rng.IntN(2) == 0
		if handled++; handled == 1 {
			w.r.t.Logf("keyback: %s: first handler %v after the Consume began", q, time.Since(start).Round(time.Millisecond))
		}
		if fail {
			fails++
		}
		mu.Unlock()
		if !fail {
			w.rec.Done(h, history.OK, history.Event{})
			return nil
		}
		err := errors.New("history: keyback handler failed")
		var waitMs int64 // the queue's schedule (retry-early reads it)
		if after {
			err, waitMs = queen.RetryAfter(kbWait, err), kbWait.Milliseconds()
		}
		w.rec.Done(h, history.OK, history.Event{Err: err.Error(), Counts: map[string]int64{"wait_ms": waitMs}})
		return err
	})
	w.rec.Done(call, history.OK, history.Event{Err: errText(err)})
	w.r.t.Logf("keyback: %s: Consume (KeyConcurrency %d) handled %d, failed %d", q, keyConc, handled, fails)
}

// kbPops pops the skip queue (Batch 2 over two partitions), failing a
// partition's first message a third of the time (Fail, Fail with
// queen.RetryAfter or Message.RetryAfter) and else acking its last.
func (w *worker) kbPops(ctx context.Context) {
	q := w.c.Queue(kbSkipQueue)
	n := 0
	defer func() { w.r.t.Logf("keyback: %s: pops failed %d", kbSkipQueue, n) }()
	for ctx.Err() == nil {
		msgs, err := recordPopErr(ctx, w.rec, w.proc, q, queen.PopOptions{Batch: 2, Partitions: 2, Wait: 200 * time.Millisecond, LeaseTime: kbLease})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		first := map[string]*queen.Message{}
		last := map[string]*queen.Message{}
		for _, m := range msgs {
			if first[m.Partition] == nil {
				first[m.Partition] = m
			}
			last[m.Partition] = m
		}
		for p, m := range first {
			if w.rng.IntN(3) != 0 {
				_ = recordSettle(ctx, w.rec, w.proc, last[p], "ack", w.rng)
				continue
			}
			n++
			switch w.rng.IntN(3) {
			case 0:
				_ = recordSettle(ctx, w.rec, w.proc, m, "fail", w.rng)
			case 1:
				_ = recordSettleWhy(ctx, w.rec, w.proc, m, "fail", w.rng, queen.RetryAfter(kbWait, errors.New("history: keyback retry after")))
			default:
				inv := w.rec.Invoke(settleEvent(w.proc, m, "fail"))
				err := m.RetryAfter(ctx, kbWait)
				switch {
				case err == nil:
					w.rec.Done(inv, history.OK, history.Event{})
				case errors.Is(err, queen.ErrLeaseLost), errors.Is(err, queen.ErrAlreadyAcked):
					w.rec.Done(inv, history.Fail, history.Event{Err: err.Error(), LeaseLost: errors.Is(err, queen.ErrLeaseLost)})
				default:
					w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
				}
			}
		}
	}
}
