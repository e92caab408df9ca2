package history_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// autoOrders runs autoOrder on client c, one after another, while ctx has
// time left for one to drain a good part of its backlog.
func (r *run) autoOrders(ctx context.Context, c *queen.Client) {
	w := &worker{c: c, rec: r.rec, proc: "main-1", idx: 5, rng: rand.New(rand.NewPCG(r.seed, 0xa0)), from: r.from, gen: r.gen, r: r}
	// genCtx has no deadline (the run stops it): stop with it.
	for ctx.Err() == nil && time.Until(deadlineOf(ctx)) > 3*time.Second {
		w.autoOrder(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// autoOrder gives a queue of its own a backlog on one partition (250 small
// items in one push) and drains it with one AutoAck Consume of several
// workers and small batches, recorded, while 50 more pushes of 10 items
// each come: each push wakes the Consume, which then claims at once, also
// while its worker runs and a claim is in flight. AutoAck holds no lease,
// so two claims in flight could take consecutive batches of the partition
// and hand the later one first: the call must still hand them in offset
// order (autoack-order). It stops once everything was handled, or after a
// while (the final drain reads the rest).
func (w *worker) autoOrder(ctx context.Context) {
	const first, more, per = 250, 50, 10
	w.n++
	q := fmt.Sprintf("autoorder-%s.%d-%d", w.proc, w.idx, w.n)
	w.r.addQueue(q, history.QueueInfo{Groups: []string{""}})
	push := func(from, n int) bool {
		items := make([]queen.Item, n)
		for j := range items {
			tx := fmt.Sprintf("%s/%d", q, from+j)
			items[j] = queen.Item{Partition: "p", TransactionID: tx, Data: payload(q, tx)}
		}
		return w.pushOwn(ctx, q, items)
	}
	if !push(0, first) {
		return // spooled or failed in an outage: the final drain reads them
	}
	cctx, stop := context.WithTimeout(ctx, 8*time.Second)
	defer stop()
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		for i := range more {
			if cctx.Err() != nil || !push(first+i*per, per) {
				return
			}
		}
	}()
	o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 2 + w.rng.IntN(9), AutoAck: true}, Concurrency: 4 + w.rng.IntN(5)}
	var handled atomic.Int64
	start := time.Now()
	call := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "consume", Queue: q, AutoAck: true})
	err := w.c.Queue(q).Consume(cctx, o, func(_ context.Context, m *queen.Message) error {
		h := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpHandler, Queue: q, Group: m.Group,
			Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}, AutoAck: true})
		w.rec.Done(h, history.OK, history.Event{})
		if handled.Add(1) == first+more*per {
			stop()
		}
		return nil
	})
	w.rec.Done(call, history.OK, history.Event{Err: errText(err)})
	<-pushed
	w.r.t.Logf("autoorder: %s: %d of %d handled in %s (Batch %d, Concurrency %d)", q, handled.Load(), first+more*per,
		time.Since(start).Round(time.Millisecond), o.Batch, o.Concurrency)
}
