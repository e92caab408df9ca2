package history_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// freezeTracer is the freeze client's Config.TracerProvider: it records
// nothing, and when armed the next consumer span it is asked to start
// runs the armed function first. That is a process frozen (a long GC, a
// stopped VM) after Consume decided to hand a message to its handler and
// before the handler began: the promise is that no handler starts once its
// batch's lease ended, however long such a pause lasts.
type freezeTracer struct {
	noop.TracerProvider
	armed atomic.Pointer[func()]
}

func (p *freezeTracer) Tracer(string, ...trace.TracerOption) trace.Tracer {
	return freezeSpans{p: p}
}

type freezeSpans struct {
	noop.Tracer
	p *freezeTracer
}

func (t freezeSpans) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if strings.HasPrefix(name, "process ") {
		if f := t.p.armed.Swap(nil); f != nil {
			(*f)()
		}
	}
	return t.Tracer.Start(ctx, name, opts...)
}

// freeze is stall with the pause moved to where a lease check cannot see
// it coming: the first handler of a batch takes every connection of its
// client's pool (no renewal gets through; taking them may take a while,
// hence a lease of seconds) and returns shortly before the lease ends, and the client then freezes in the next message's span start
// until the other client's Consume has claimed the batch and runs a slow
// handler. The frozen Consume must not start that message's handler
// (concurrent-handlers).
func (w *worker) freeze(ctx context.Context, tp *freezeTracer) {
	q, stored := w.ownQueue(ctx, "freeze", 6, false, history.QueueInfo{Groups: []string{""}})
	if !stored {
		return
	}
	const batch = 6
	const otherProc = "main-0" // the run's freeze worker reads with main-0's client beside
	record := func(proc string, m *queen.Message) history.Event {
		return w.rec.Invoke(history.Event{Proc: proc, Op: history.OpHandler, Queue: q, Group: m.Group,
			Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}})
	}
	frozen := make(chan struct{})
	taken := make(chan struct{}) // the other Consume runs a handler of the batch
	var once, takenOnce, releaseOnce sync.Once
	release := func() {} // the held connections, if the thaw never ran
	var wg sync.WaitGroup
	actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), 8*time.Second)
	defer acancel()
	wg.Go(func() {
		o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: batch, LeaseTime: 2 * time.Second, Wait: 200 * time.Millisecond}}
		_ = w.c.Queue(q).Consume(actx, o, func(_ context.Context, m *queen.Message) error {
			h := record(w.proc, m)
			first := false
			once.Do(func() { first = true })
			if first {
				held := w.takePool(actx)
				release = func() {
					releaseOnce.Do(func() {
						for _, c := range held {
							c.Release()
						}
					})
				}
				exp := m.LeaseExpiresAt
				thaw := func() {
					defer release()
					select {
					case <-taken:
						time.Sleep(20 * time.Millisecond)
					case <-time.After(time.Until(exp) + 3*time.Second):
					case <-actx.Done():
					}
				}
				tp.armed.Store(&thaw)
				close(frozen)
				time.Sleep(time.Until(exp) - 150*time.Millisecond)
			}
			w.rec.Done(h, history.OK, history.Event{})
			return nil
		})
	})
	select {
	case <-frozen:
	case <-actx.Done():
		wg.Wait()
		return
	}
	bctx, bcancel := context.WithTimeout(context.WithoutCancel(ctx), 6*time.Second)
	defer bcancel()
	o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Partition: "p", Batch: batch, LeaseTime: 3 * time.Second, Wait: 100 * time.Millisecond}}
	_ = w.other.Queue(q).Consume(bctx, o, func(_ context.Context, m *queen.Message) error {
		h := record(otherProc, m)
		takenOnce.Do(func() { close(taken) })
		time.Sleep(300 * time.Millisecond)
		w.rec.Done(h, history.OK, history.Event{})
		return nil
	})
	wg.Wait()
	tp.armed.Store(nil) // a round that never reached the second message
	release()
}
