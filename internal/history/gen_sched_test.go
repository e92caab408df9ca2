package history_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// The "sched", "retrywait" and "discard" generators (check_sched.go
// judges what they record).
const (
	schedQueue = "sched"
	retryQueue = "retryq"
	// retryMin and retryMax are retryQueue's RetryBackoff.
	retryMin = 300 * time.Millisecond
	retryMax = 600 * time.Millisecond
)

// startSched starts the generators that are on; end is when generating
// stops (scheduling stops early enough for every due time to pass by then).
func (r *run) startSched(genCtx context.Context, wg *sync.WaitGroup, clients []*queen.Client, end time.Time) {
	mk := func(i int, stream uint64) *worker {
		return &worker{c: clients[i], rec: r.rec, proc: fmt.Sprintf("main-%d", i), idx: 6, rng: rand.New(rand.NewPCG(r.seed, stream)),
			from: r.from, gen: r.gen, r: r, other: clients[1-i]}
	}
	if r.gen["sched"] {
		w, cw := mk(0, 0x5c4ed), mk(1, 0x5c4ee)
		cw.idx = 7
		if err := w.c.Queue(schedQueue).Configure(genCtx, queen.QueueOptions{RetryLimit: 2, LeaseTime: 5 * time.Second}); err == nil {
			r.addQueue(schedQueue, history.QueueInfo{Groups: []string{""}})
			wg.Go(func() { w.schedule(genCtx, end) })
			wg.Go(func() { cw.schedConsume(genCtx) })
		}
	}
	if r.gen["retrywait"] {
		w := mk(1, 0x7e7a)
		// A low RetryLimit: dead letters for "discard" within a short run.
		o := queen.QueueOptions{RetryLimit: 2, DeadLetter: true, LeaseTime: 5 * time.Second, RetryBackoff: queen.RetryBackoff{Min: retryMin, Max: retryMax}}
		if err := w.c.Queue(retryQueue).Configure(genCtx, o); err == nil {
			r.addQueue(retryQueue, history.QueueInfo{Groups: []string{""}, DeadLetter: true, RetryMin: retryMin})
			wg.Go(func() { w.retryAfters(genCtx) })
		}
	}
	if r.gen["discard"] {
		w := mk(0, 0xd15c)
		w.idx = 8
		wg.Go(func() { w.discards(genCtx) })
	}
}

// retryMinOf is what the checker may assume of a run queue's retry wait:
// its RetryBackoff.Min (the default when unset) where its FailurePolicy
// stays pause all run ("pause" switches, "doomed" is deleted).
func retryMinOf(name string, o queen.QueueOptions) time.Duration {
	if name == "pause" || name == "skip" || name == "doomed" || o.FailurePolicy == queen.FailureSkip || o.RetryBackoff.Disabled {
		return 0
	}
	if o.RetryBackoff.Min == 0 {
		return queen.DefaultRetryBackoffMin
	}
	return o.RetryBackoff.Min
}

// schedule pushes items with a DeliverAt 0.2-3 s ahead (some in the past,
// some repeating a transaction id scheduled a moment ago) and cancels a
// random one of them now and then, one transaction id a call.
func (w *worker) schedule(ctx context.Context, end time.Time) {
	type pending struct {
		tx string
		at time.Time
	}
	var recent []pending
	n, cancels, counted := 0, 0, 0
	statuses := map[queen.PushStatus]int{}
	q := w.c.Queue(schedQueue)
	defer func() {
		w.r.t.Logf("sched: %d transaction ids, items %v, %d cancels (%d counted)", n, statuses, cancels, counted)
	}()
	for ctx.Err() == nil {
		// Due by shortly after the run's end: the final drain waits for
		// them (waitScheduled) past its own start anyway.
		ahead := min(3*time.Second, time.Until(end)+2*time.Second)
		if ahead < 300*time.Millisecond {
			break
		}
		items := make([]queen.Item, 1+w.rng.IntN(8))
		delays := make([]time.Duration, len(items))
		for i := range items {
			tx := fmt.Sprintf("sched-%d", n)
			if len(recent) > 0 && w.rng.IntN(4) == 0 {
				tx = recent[w.rng.IntN(len(recent))].tx
			} else {
				n++
			}
			// A delay now, a time after the invoke is recorded: under load
			// the recorder's lock may take seconds.
			delay := 200*time.Millisecond + time.Duration(w.rng.Int64N(int64(ahead-200*time.Millisecond)))
			if w.rng.IntN(5) == 0 {
				delay = -time.Duration(w.rng.IntN(1000)) * time.Millisecond
			}
			items[i] = queen.Item{Partition: fmt.Sprintf("s%d", w.rng.IntN(3)), TransactionID: tx, Data: payload(schedQueue, tx)}
			delays[i] = delay
		}
		inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Queue: schedQueue, Items: histItems(items)})
		ats := make([]int64, len(items))
		now := time.Now()
		for i := range items {
			items[i].DeliverAt = now.Add(delays[i])
			ats[i] = items[i].DeliverAt.UnixNano()
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		res, err := q.Push(pctx, items)
		cancel()
		if err != nil {
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error(), DeliverAt: ats})
		} else {
			w.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res), DeliverAt: ats})
			for i, r := range res {
				statuses[r.Status]++
				if r.Status == queen.Scheduled {
					recent = append(recent, pending{items[i].TransactionID, items[i].DeliverAt})
				}
			}
			if len(recent) > 20 {
				recent = recent[len(recent)-20:]
			}
		}
		if len(recent) > 0 && w.rng.IntN(3) == 0 {
			// Often still waiting, sometimes moved already (0).
			p := recent[w.rng.IntN(len(recent))]
			inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "cancel-scheduled", Queue: schedQueue,
				Msgs: []history.Delivery{{TxID: p.tx}}})
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			k, err := q.CancelScheduled(cctx, []string{p.tx})
			cancel()
			cancels++
			counted += k
			if err != nil {
				w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
			} else {
				w.rec.Done(inv, history.OK, history.Event{Counts: map[string]int64{"cancelled": int64(k)}})
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(50+w.rng.IntN(150)) * time.Millisecond):
		}
	}
}

// schedConsume pops the scheduled queue as its messages come due, acking
// each batch, so an early one shows.
func (w *worker) schedConsume(ctx context.Context) {
	q := w.c.Queue(schedQueue)
	for ctx.Err() == nil {
		msgs, err := recordPopErr(ctx, w.rec, w.proc, q, queen.PopOptions{Batch: 20, Partitions: 3, Wait: 300 * time.Millisecond, LeaseTime: 5 * time.Second})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		last := map[string]*queen.Message{}
		for _, m := range msgs {
			last[m.Partition] = m
		}
		for _, m := range last {
			_ = recordSettle(ctx, w.rec, w.proc, m, "ack", w.rng)
		}
		if len(msgs) == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// waitScheduled waits until every message the run scheduled was appended
// (all are due before the run ends): the final drain must find them.
func (r *run) waitScheduled(ctx context.Context, admin *queen.Client) {
	if !r.gen["sched"] {
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		st, err := admin.Queue(schedQueue).Status(ctx)
		if err == nil && st.Scheduled == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Logf("sched: messages still scheduled after 60 s")
}

// retryAfters fails messages of a queue with a 300-600 ms RetryBackoff,
// by the queue's schedule or with an explicit wait of 0.2-1 s (Fail with
// queen.RetryAfter, Message.RetryAfter, a Consume handler returning
// queen.RetryAfter), recording each wait: a redelivery before it is
// retry-early.
func (w *worker) retryAfters(ctx context.Context) {
	q := w.c.Queue(retryQueue)
	n := 0
	defer func() { w.r.t.Logf("retrywait: %d pushed, %d failures with a wait recorded", n, w.n) }()
	for ctx.Err() == nil {
		items := make([]queen.Item, 6)
		for i := range items {
			n++
			tx := fmt.Sprintf("retry-%d", n)
			items[i] = queen.Item{Partition: fmt.Sprintf("r%d", i%2), TransactionID: tx, Data: payload(retryQueue, tx)}
		}
		w.pushOwn(ctx, retryQueue, items)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if w.rng.IntN(2) == 0 {
			w.retryPops(rctx, q)
		} else {
			w.retryConsume(rctx, q)
		}
		cancel()
	}
}

// wait draws an explicit wait (0: the queue's schedule).
func (w *worker) wait() time.Duration {
	if w.rng.IntN(3) == 0 {
		return 0
	}
	return time.Duration(200+w.rng.IntN(800)) * time.Millisecond
}

func (w *worker) retryPops(ctx context.Context, q *queen.Queue) {
	for ctx.Err() == nil {
		msgs, err := recordPopErr(ctx, w.rec, w.proc, q, queen.PopOptions{Batch: 2, Partitions: 2, Wait: 200 * time.Millisecond, LeaseTime: 5 * time.Second})
		if err != nil {
			return
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
			if w.rng.IntN(3) == 0 {
				_ = recordSettle(ctx, w.rec, w.proc, last[p], "ack", w.rng)
				continue
			}
			w.n++
			d := w.wait()
			inv := settleEvent(w.proc, m, "fail")
			inv.Counts = map[string]int64{"wait_ms": d.Milliseconds()}
			inv = w.rec.Invoke(inv)
			var err error
			switch {
			case d > 0 && w.rng.IntN(2) == 0:
				err = m.RetryAfter(ctx, d)
			default:
				err = m.Fail(ctx, queen.RetryAfter(d, errors.New("history: retry after")))
			}
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

func (w *worker) retryConsume(ctx context.Context, q *queen.Queue) {
	o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 2, LeaseTime: 5 * time.Second}}
	call := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "consume", Queue: retryQueue})
	var mu sync.Mutex // the handlers' draws
	err := q.Consume(ctx, o, func(_ context.Context, m *queen.Message) error {
		h := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpHandler, Queue: retryQueue, Group: m.Group,
			Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}})
		mu.Lock()
		fail, d := w.rng.IntN(3) != 0, w.wait()
		if fail {
			w.n++
		}
		mu.Unlock()
		if !fail {
			w.rec.Done(h, history.OK, history.Event{})
			return nil
		}
		err := queen.RetryAfter(d, errors.New("history: handler retry after"))
		w.rec.Done(h, history.OK, history.Event{Err: err.Error(), Counts: map[string]int64{"wait_ms": d.Milliseconds()}})
		return err
	})
	w.rec.Done(call, history.OK, history.Event{Err: errText(err)})
}

// discards discards one dead letter at a time, by its id, of a queue that
// keeps them, then lists that id again.
func (w *worker) discards(ctx context.Context) {
	var qs []string
	for _, s := range queueSpecs {
		if s.opts.DeadLetter && s.name != "doomed" {
			qs = append(qs, s.name)
		}
	}
	if w.gen["retrywait"] {
		qs = append(qs, retryQueue)
	}
	defer func() { w.r.t.Logf("discard: %d dead letters discarded", w.n) }()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(200+w.rng.IntN(500)) * time.Millisecond):
		}
		qn := qs[w.rng.IntN(len(qs))]
		q := w.c.Queue(qn)
		dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{Limit: 20})
		if err != nil || len(dls) == 0 {
			continue
		}
		d := dls[w.rng.IntN(len(dls))]
		dl := map[string]int64{"dl": d.ID}
		inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "discard", Queue: qn, Group: d.Group, Counts: dl,
			Msgs: []history.Delivery{{Partition: d.Partition, Offset: d.Offset, ID: d.MessageID.String(), TxID: d.TransactionID}}})
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		k, err := q.DiscardDeadLetters(dctx, queen.DeadLetterQuery{IDs: []int64{d.ID}})
		cancel()
		if err != nil {
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
			continue
		}
		w.rec.Done(inv, history.OK, history.Event{Counts: map[string]int64{"discarded": int64(k)}})
		w.n += k
		inv = w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "deadletters", Queue: qn, Group: d.Group, Counts: dl})
		again, err := q.DeadLetters(ctx, queen.DeadLetterQuery{IDs: []int64{d.ID}})
		if err != nil {
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
			continue
		}
		w.rec.Done(inv, history.OK, history.Event{Counts: map[string]int64{"listed": int64(len(again))}})
	}
}
