package history_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// stall makes a Consume lose its lease in the middle of a batch, as a
// process cut off from the database does: its first handler takes every
// connection of its client's pool (no renewal can get through) and holds
// them past the lease, while the other client's Consume of the same
// partition claims the batch once the lease ended and runs slow handlers.
// The first Consume must start no handler of that batch once its lease
// ended (concurrent-handlers).
func (w *worker) stall(ctx context.Context) {
	q, stored := w.ownQueue(ctx, "stall", 6, false, history.QueueInfo{Groups: []string{""}})
	if !stored {
		return
	}
	const batch = 6
	other := "main-0"
	if w.proc == "main-0" {
		other = "main-1"
	}
	record := func(proc string, m *queen.Message) history.Event {
		return w.rec.Invoke(history.Event{Proc: proc, Op: history.OpHandler, Queue: q, Group: m.Group,
			Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}})
	}
	stalled := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer acancel()
	wg.Go(func() {
		o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: batch, LeaseTime: 500 * time.Millisecond, Wait: 200 * time.Millisecond}}
		_ = w.c.Queue(q).Consume(actx, o, func(_ context.Context, m *queen.Message) error {
			h := record(w.proc, m)
			first := false
			once.Do(func() { first = true })
			if first {
				held := w.takePool(actx)
				close(stalled)
				time.Sleep(time.Until(m.LeaseExpiresAt) + 700*time.Millisecond)
				for _, c := range held {
					c.Release()
				}
			}
			w.rec.Done(h, history.OK, history.Event{})
			return nil
		})
	})
	select {
	case <-stalled:
	case <-actx.Done():
		wg.Wait()
		return
	}
	bctx, bcancel := context.WithTimeout(context.WithoutCancel(ctx), 4*time.Second)
	defer bcancel()
	o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Partition: "p", Batch: batch, LeaseTime: 3 * time.Second, Wait: 100 * time.Millisecond}}
	_ = w.other.Queue(q).Consume(bctx, o, func(_ context.Context, m *queen.Message) error {
		h := record(other, m)
		time.Sleep(150 * time.Millisecond)
		w.rec.Done(h, history.OK, history.Event{})
		return nil
	})
	wg.Wait()
}

// takePool acquires every connection of the worker's client it can get
// within a moment each.
func (w *worker) takePool(ctx context.Context) []*pgxpool.Conn {
	var held []*pgxpool.Conn
	for range w.c.Pool().Config().MaxConns {
		actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		c, err := w.c.Pool().Acquire(actx)
		cancel()
		if err != nil {
			break
		}
		held = append(held, c)
	}
	return held
}

// ownQueue names a fresh queue of this worker (kind-proc.idx-n) read by
// group "" (and late, if given), pushes n items to its partition "p"
// (each with a key of its own if keyed), recorded, and says whether they
// were all stored (not spooled: the final drain delivers those).
func (w *worker) ownQueue(ctx context.Context, kind string, n int, keyed bool, qi history.QueueInfo) (string, bool) {
	w.n++
	q := fmt.Sprintf("%s-%s.%d-%d", kind, w.proc, w.idx, w.n)
	w.r.addQueue(q, qi)
	items := make([]queen.Item, n)
	for i := range items {
		tx := fmt.Sprintf("%s/%d", q, i)
		items[i] = queen.Item{Partition: "p", TransactionID: tx, Data: payload(q, tx)}
		if keyed {
			items[i].Key = fmt.Sprintf("k%d", i)
		}
	}
	return q, w.pushOwn(ctx, q, items)
}

// pushOwn pushes items, recorded, and says whether all were stored. The
// end of the run must not cut the push short (see push).
func (w *worker) pushOwn(ctx context.Context, q string, items []queen.Item) bool {
	inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Queue: q, Items: histItems(items)})
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	res, err := w.c.Queue(q).Push(pctx, items)
	cancel()
	if err != nil {
		w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return false
	}
	w.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
	for _, r := range res {
		if r.Status != queen.Queued {
			return false
		}
	}
	return true
}
