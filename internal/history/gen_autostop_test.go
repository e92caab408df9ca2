package history_test

import (
	"context"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// autoStop stops an AutoAck Consume with KeyConcurrency while its claimed
// batch is under way, on a queue of its own: the claim consumed the whole
// batch, so every message of it must still reach a handler
// (autoack-unhandled), the unstarted keys too.
func (w *worker) autoStop(ctx context.Context) {
	const batch = 8
	q, stored := w.ownQueue(ctx, "autostop", batch, true, history.QueueInfo{Groups: []string{""}})
	if !stored {
		return
	}
	cctx, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer stop()
	started := make(chan struct{}, batch)
	o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: batch, AutoAck: true, Wait: 100 * time.Millisecond},
		KeyConcurrency: 2 + w.rng.IntN(2)}
	call := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "consume", Queue: q, AutoAck: true, Keyed: true})
	done := make(chan error, 1)
	go func() {
		done <- w.c.Queue(q).Consume(cctx, o, func(_ context.Context, m *queen.Message) error {
			h := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpHandler, Queue: q, Group: m.Group,
				Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}, AutoAck: true})
			started <- struct{}{}
			time.Sleep(30 * time.Millisecond) // the stop meets keys not started yet
			w.rec.Done(h, history.OK, history.Event{})
			return nil
		})
	}()
	select {
	case <-started:
		stop() // a graceful stop, mid-batch
	case <-cctx.Done():
	}
	err := <-done
	w.rec.Done(call, history.OK, history.Event{Err: errText(err)})
}

// autoStops runs autoStop about every second until ctx ends.
func (w *worker) autoStops(ctx context.Context) {
	for ctx.Err() == nil {
		w.autoStop(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(500+w.rng.IntN(1000)) * time.Millisecond):
		}
	}
}
