package queen

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/e03140bc/queen/internal/maintain"
	"github.com/e03140bc/queen/internal/settings"
	"github.com/e03140bc/queen/internal/settle"
	"github.com/e03140bc/queen/internal/wake"
)

// service is one part of the engine that Open starts and Close stops.
type service struct {
	name  string
	start func(ctx context.Context) error
	// stop returns once what start began is over. ctx bounds the stops that
	// flush (pushes, settlements) or wait for Consume handlers.
	stop func(ctx context.Context) error
}

// services lists the engine's services in start order: each may rely on the
// ones before it, so Close stops them in reverse and nothing is stopped
// while a service still running can reach it. The order, as Close sees it:
//
//   - Running Consume calls first: they stop claiming and settle what their
//     handlers finish, which needs the ack engine and the pool.
//   - The metric callbacks, which read the drain and the spool.
//   - The listener: its notifications reach the wake hub and the
//     maintenance flag it re-reads kicks the drain.
//   - The scheduled mover, which the listener's notifications kick; it
//     tells the wake hub of what it moved.
//   - The spool drain, which hands replayed records to push fusion.
//   - Intake and pending pushes, then settlements: they still need the pool
//     and the engine's context; what cannot commit is spooled.
//   - The wake hub, which the flushes tell of their commits; the maintainer.
//   - The engine's context, which bounds every flush; then the spool, which
//     the flushes and the drain write and read.
//
// The pool is not a service: Open needs it before anything starts, and it is
// closed last.
func (e *engine) services() []service {
	return []service{
		{name: "spool",
			start: func(context.Context) (err error) {
				e.spool, err = openSpool(e)
				return err
			},
			stop: func(context.Context) error {
				if err := e.spool.Close(); err != nil {
					return fmt.Errorf("queen: close spool: %w", err)
				}
				return nil
			}},
		{name: "engine context",
			start: func(context.Context) error {
				e.ctx, e.cancel = context.WithCancel(context.Background())
				e.meta = settings.New(e.ctx, e.cfg.StatementTimeout, e.readQueueMeta, e.cfg.testKnobs().metaCacheMax)
				return nil
			},
			stop: func(context.Context) error { e.cancel(); return nil }},
		{name: "maintenance",
			start: func(context.Context) (err error) {
				e.maint, err = maintain.New(e.ctx, maintain.Params{
					Pool: e.pool, SQL: e.sql, Timeout: e.cfg.StatementTimeout, Log: e.log,
					MeterProvider: e.cfg.MeterProvider, Config: maintain.Config(e.cfg.Maintenance),
					MemberTTL: e.cfg.test.memberTTL, SampleWidth: e.cfg.test.sampleInterval, SampleSlots: SamplesKept,
					Routed: e.cfg.Citus,
				})
				return err
			},
			stop: func(context.Context) error { e.maint.Close(); return nil }},
		{name: "wake hub",
			start: func(context.Context) error {
				e.wake = wake.New(e.ctx, wake.Config{
					Pool: e.pool, Notify: cmp.Or(e.sql.NotifyAlone, e.sql.Notify), Channel: e.sql.Channel,
					Timeout: e.cfg.StatementTimeout, Log: e.log,
					// The listener starts after the drain.
					OnMaintenance: func() {
						if e.refreshMaintenance(e.ctx) {
							e.drain.kick()
						}
					},
					// The listener starts after the mover.
					OnScheduled: func(due time.Time) { e.mover.note(due) },
				})
				return nil
			},
			stop: func(context.Context) error { e.wake.Close(); return nil }},
		{name: "ack fusion",
			start: func(context.Context) error {
				cfg := settle.Config{Pool: e.pool, SQL: e.csql, Hold: e.cfg.Fusion.Hold, Timeout: e.cfg.StatementTimeout}
				if e.placement != nil {
					cfg.Worker = e.workerOfID
				}
				e.acks = settle.New(e.ctx, cfg)
				return nil
			},
			stop: func(ctx context.Context) error { return e.acks.Close(ctx) }},
		{name: "push fusion",
			start: func(context.Context) error { e.push = newPusher(e); return nil },
			stop:  func(ctx context.Context) error { return e.push.close(ctx) }},
		{name: "spool drain",
			start: func(context.Context) error { e.drain = newDrainer(e); return nil },
			stop:  func(context.Context) error { e.drain.close(); return nil }},
		{name: "scheduled mover",
			start: func(context.Context) error {
				e.mover = newMover(e, e.cfg.testKnobs().schedulePollOr(defaultSchedulePoll))
				return nil
			},
			stop: func(ctx context.Context) error { return e.mover.close(ctx) }},
		{name: "listener",
			start: func(context.Context) error {
				e.listen = wake.Listen(e.wake, e.pool.Config().ConnConfig, e.sql.Channel, e.log)
				return nil
			},
			stop: func(context.Context) error { e.listen.Close(); return nil }},
		{name: "spool metrics",
			start: func(context.Context) (err error) {
				e.spoolReg, err = registerSpoolMetrics(e)
				return err
			},
			stop: func(context.Context) error { _ = e.spoolReg.Unregister(); return nil }},
		{name: "key metrics",
			start: func(context.Context) (err error) {
				e.keyReg, err = registerKeyMetrics(e)
				return err
			},
			stop: func(context.Context) error { _ = e.keyReg.Unregister(); return nil }},
		// Consume calls start themselves; Close stops them first.
		{name: "consumes",
			start: func(context.Context) error { return nil },
			stop:  func(ctx context.Context) error { e.stopConsumes(ctx); return nil }},
	}
}

// startServices starts the engine's services in order. If one fails, those
// already started are stopped (in reverse, bounded by ctx) and its error is
// returned.
func (e *engine) startServices(ctx context.Context) error {
	e.svcs = e.services()
	for i, s := range e.svcs {
		if err := s.start(ctx); err != nil {
			e.log.Debug("queen: a service failed to start; stopping the others", "service", s.name, "err", err)
			_ = stopServices(ctx, e.svcs[:i])
			return err
		}
	}
	return nil
}

// stopServices stops svcs in reverse order, every one of them, and returns
// the first error.
func stopServices(ctx context.Context, svcs []service) error {
	var first error
	for i := len(svcs) - 1; i >= 0; i-- {
		if err := svcs[i].stop(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}
