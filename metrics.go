package queen

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// meters are the engine's OpenTelemetry instruments. Counter names come out
// in Prometheus with a _total suffix, matching the seed's names
// (queen.push.items_total, ...).
type meters struct {
	itemsFired     metric.Int64Counter
	itemsPerBundle metric.Int64Histogram
	commits        metric.Int64Counter
	segments       metric.Int64Counter
	bundleErrors   metric.Int64Counter
	bundleSecs     metric.Float64Histogram

	consume *consumeMeters
}

func newMeters(mp metric.MeterProvider) (*meters, error) {
	m := mp.Meter("github.com/e03140bc/queen")
	var (
		x   meters
		err error
	)
	try := func(f func() error) {
		if err == nil {
			err = f()
		}
	}
	try(func() (e error) {
		x.itemsFired, e = m.Int64Counter("queen.push.items", metric.WithUnit("{message}"), metric.WithDescription("Items sent to PostgreSQL in push bundles."))
		return
	})
	try(func() (e error) {
		x.itemsPerBundle, e = m.Int64Histogram("queen.push.bundle.items", metric.WithUnit("{message}"), metric.WithDescription("Items per committed push bundle."),
			metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000))
		return
	})
	try(func() (e error) {
		x.commits, e = m.Int64Counter("queen.push.bundles", metric.WithUnit("{bundle}"), metric.WithDescription("Push bundle transactions committed."))
		return
	})
	try(func() (e error) {
		x.segments, e = m.Int64Counter("queen.push.segments", metric.WithUnit("{segment}"), metric.WithDescription("Segments committed (one per partition per bundle)."))
		return
	})
	try(func() (e error) {
		x.bundleErrors, e = m.Int64Counter("queen.push.bundle.errors", metric.WithUnit("{bundle}"), metric.WithDescription("Push bundles that failed as a whole."))
		return
	})
	try(func() (e error) {
		x.bundleSecs, e = m.Float64Histogram("queen.push.bundle.duration", metric.WithUnit("s"),
			metric.WithDescription("Push bundle round trip, from call to commit."))
		return
	})
	try(func() (e error) {
		x.consume, e = newConsumeMeters(m)
		return
	})
	if err != nil {
		return nil, err
	}
	return &x, nil
}

var okAttr = metric.WithAttributes(attribute.Bool("ok", true))

func (m *meters) bundle(ctx context.Context, segments, items int, err error, d time.Duration) {
	ctx = context.WithoutCancel(ctx)
	if err != nil {
		m.bundleErrors.Add(ctx, 1)
		return
	}
	m.itemsFired.Add(ctx, int64(items))
	m.itemsPerBundle.Record(ctx, int64(items))
	m.commits.Add(ctx, 1)
	m.segments.Add(ctx, int64(segments))
	m.bundleSecs.Record(ctx, d.Seconds(), okAttr)
}

// registerKeyMetrics registers the gauges of per-key parallel Consume
// (KeyConcurrency > 1), observed per partition this client is handling a
// batch of, from in-process numbers: queen.client.keys.in_flight (keys
// with a handler running) and queen.client.keys.paused (keys a failure
// paused in the running batch), with attributes queue, group and partition.
func registerKeyMetrics(e *engine) (metric.Registration, error) {
	m := e.cfg.MeterProvider.Meter("github.com/e03140bc/queen")
	inFlight, err := m.Int64ObservableGauge("queen.client.keys.in_flight", metric.WithUnit("{key}"),
		metric.WithDescription("Ordering keys with a handler running, per partition batch this client holds (KeyConcurrency > 1)."))
	if err != nil {
		return nil, err
	}
	paused, err := m.Int64ObservableGauge("queen.client.keys.paused", metric.WithUnit("{key}"),
		metric.WithDescription("Ordering keys paused by a failure in the batch this client holds, per partition (KeyConcurrency > 1)."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		e.keyStats.each(func(k keyStatKey, f, p int64) {
			attrs := metric.WithAttributes(attribute.String("queue", k.queue), attribute.String("group", k.group),
				attribute.String("partition", k.partition))
			o.ObserveInt64(inFlight, f, attrs)
			o.ObserveInt64(paused, p, attrs)
		})
		return nil
	}, inFlight, paused)
}

// Outcomes of a settlement, the messaging.operation.name of
// queen.client.settled.messages.
const (
	outcomeAck        = iota // "ack"
	outcomeFail              // "fail"
	outcomeRetry             // "retry"
	outcomeDeadLetter        // "dead_letter"
	outcomeReleased          // "released": handed back uncharged by a stopping Consume
	nOutcomes
)

var outcomeNames = [nOutcomes]string{"ack", "fail", "retry", "dead_letter", "released"}

// Why a message went to the dead-letter store, the queen.dead_letter.cause
// of queen.client.dead_lettered.messages.
const (
	causeRequested   = iota // "requested": DeadLetter, AckBatch's AckDeadLetter
	causeRetryLimit         // "retry_limit": the failure that spent RetryLimit
	causeUndecodable        // "undecodable": a claim could not decode or decrypt it
	nCauses
)

var causeNames = [nCauses]string{"requested", "retry_limit", "undecodable"}

// The consume-side instruments; messaging.* names follow the OpenTelemetry
// messaging semantic conventions (v1.43.0), queen.* ones have no
// convention.
const (
	metricConsumed     = "messaging.client.consumed.messages"
	metricProcess      = "messaging.process.duration"
	metricSettled      = "queen.client.settled.messages"
	metricLeaseLost    = "queen.client.lease.lost"
	metricDeadLettered = "queen.client.dead_lettered.messages"
)

// consumeMeters are the consume-side instruments and the attribute sets
// measured with them, per (queue, group).
type consumeMeters struct {
	consumed     metric.Int64Counter
	process      metric.Float64Histogram
	settled      metric.Int64Counter
	leaseLost    metric.Int64Counter
	deadLettered metric.Int64Counter

	mu    sync.Mutex
	dests map[destKey]*destMeter
}

type destKey struct{ queue, group string }

// maxDestMeters bounds the cache of per-(queue, group) attribute sets: an
// application naming queues without bound gets uncached (allocating)
// measurements past it rather than unbounded memory.
const maxDestMeters = 4096

func newConsumeMeters(m metric.Meter) (*consumeMeters, error) {
	var (
		x   = consumeMeters{dests: map[destKey]*destMeter{}}
		err error
	)
	try := func(f func() error) {
		if err == nil {
			err = f()
		}
	}
	try(func() (e error) {
		x.consumed, e = m.Int64Counter(metricConsumed, metric.WithUnit("{message}"),
			metric.WithDescription("Messages delivered to the application: handed to a Consume handler or returned by Pop."))
		return
	})
	try(func() (e error) {
		x.process, e = m.Float64Histogram(metricProcess, metric.WithUnit("s"),
			metric.WithDescription("Duration of a Consume handler call."),
			metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
		return
	})
	try(func() (e error) {
		x.settled, e = m.Int64Counter(metricSettled, metric.WithUnit("{message}"),
			metric.WithDescription("Messages settled, by outcome (messaging.operation.name): ack, fail, retry, dead_letter, released."))
		return
	})
	try(func() (e error) {
		x.leaseLost, e = m.Int64Counter(metricLeaseLost, metric.WithUnit("{lease}"),
			metric.WithDescription("Leases found lost (expired or taken over) by a renewal or a settlement."))
		return
	})
	try(func() (e error) {
		x.deadLettered, e = m.Int64Counter(metricDeadLettered, metric.WithUnit("{message}"),
			metric.WithDescription("Messages moved to the dead-letter store, by queen.dead_letter.cause."))
		return
	})
	if err != nil {
		return nil, err
	}
	return &x, nil
}

// destMeter is one (queue, group)'s attribute options, built once so that
// a measurement allocates nothing.
type destMeter struct {
	m        *consumeMeters
	attrs    []attribute.KeyValue // messaging.system, destination, consumer group
	process  []metric.AddOption   // consumed by a Consume handler
	receive  []metric.AddOption   // consumed by Pop
	procOK   []metric.RecordOption
	outcomes [nOutcomes][]metric.AddOption
	lost     []metric.AddOption
	dead     [nCauses][]metric.AddOption
}

// dest returns the attribute options of queue and group.
func (m *consumeMeters) dest(queue, group string) *destMeter {
	k := destKey{queue, group}
	m.mu.Lock()
	d := m.dests[k]
	m.mu.Unlock()
	if d != nil {
		return d
	}
	d = newDestMeter(m, queue, group)
	m.mu.Lock()
	if len(m.dests) < maxDestMeters {
		m.dests[k] = d
	}
	m.mu.Unlock()
	return d
}

func newDestMeter(m *consumeMeters, queue, group string) *destMeter {
	base := []attribute.KeyValue{
		attribute.String("messaging.system", "queen"),
		attribute.String("messaging.destination.name", queue),
		attribute.String("messaging.consumer.group.name", group),
	}
	with := func(kv ...attribute.KeyValue) attribute.Set {
		return attribute.NewSet(append(slices.Clip(base), kv...)...)
	}
	add := func(s attribute.Set) []metric.AddOption { return []metric.AddOption{metric.WithAttributeSet(s)} }
	d := &destMeter{m: m, attrs: base}
	d.process = add(with(attribute.String("messaging.operation.name", "process")))
	d.receive = add(with(attribute.String("messaging.operation.name", "receive")))
	d.procOK = []metric.RecordOption{metric.WithAttributeSet(with(attribute.String("messaging.operation.name", "process")))}
	for i, o := range outcomeNames {
		d.outcomes[i] = add(with(attribute.String("messaging.operation.type", "settle"), attribute.String("messaging.operation.name", o)))
	}
	d.lost = add(with())
	for i, c := range causeNames {
		d.dead[i] = add(with(attribute.String("queen.dead_letter.cause", c)))
	}
	return d
}

// consumed counts n messages delivered, by Pop (receive) or to a handler.
func (d *destMeter) consumed(ctx context.Context, n int, receive bool) {
	if n <= 0 {
		return
	}
	opts := d.process
	if receive {
		opts = d.receive
	}
	d.m.consumed.Add(ctx, int64(n), opts...)
}

// timed reports whether processed records anything: else a handler call
// need not read the clock.
func (d *destMeter) timed(ctx context.Context) bool { return d.m.process.Enabled(ctx) }

// processed records one handler call of duration dur that returned err.
func (d *destMeter) processed(ctx context.Context, dur time.Duration, err error) {
	if err == nil {
		d.m.process.Record(ctx, dur.Seconds(), d.procOK...)
		return
	}
	if !d.m.process.Enabled(ctx) {
		return
	}
	attrs := append(slices.Clip(d.attrs), attribute.String("messaging.operation.name", "process"),
		attribute.String("error.type", errorType(err)))
	d.m.process.Record(ctx, dur.Seconds(), metric.WithAttributes(attrs...))
}

// settled counts n messages settled with outcome.
func (d *destMeter) settled(ctx context.Context, outcome, n int) {
	if n > 0 {
		d.m.settled.Add(ctx, int64(n), d.outcomes[outcome]...)
	}
}

// leaseLost counts one lease found lost.
func (d *destMeter) leaseLost(ctx context.Context) {
	d.m.leaseLost.Add(ctx, 1, d.lost...)
}

// deadLettered counts n messages dead-lettered for cause.
func (d *destMeter) deadLettered(ctx context.Context, cause, n int) {
	if n > 0 {
		d.m.deadLettered.Add(ctx, int64(n), d.dead[cause]...)
	}
}

// settledOp counts what a non-keyed settlement applied with status st:
// acks messages acked (its cumulative part) and its action's message,
// n of them for a release. A refused settlement counts nothing (the
// caller counts a lost lease once).
func (d *destMeter) settledOp(ctx context.Context, op *settleOp, acks, n int, st int16) {
	if statusErr(st) != nil {
		return
	}
	d.settled(ctx, outcomeAck, acks)
	switch op.act {
	case actFail:
		d.settled(ctx, outcomeFail, 1)
	case actRetry:
		d.settled(ctx, outcomeRetry, 1)
	case actDeadLetter:
		d.settled(ctx, outcomeDeadLetter, 1)
	case actInterrupt:
		d.settled(ctx, outcomeReleased, n)
	}
	if st == stDeadLetter {
		cause := causeRetryLimit
		if op.act == actDeadLetter {
			cause = causeRequested
		}
		d.deadLettered(ctx, cause, 1)
	}
}

// settledRows counts what an out-of-order settlement applied, one status
// per row.
func (d *destMeter) settledRows(ctx context.Context, rows []keyedRow, sts []int16) {
	for i, r := range rows {
		if i >= len(sts) || statusErr(sts[i]) != nil {
			continue
		}
		switch r.act {
		case actNone:
			d.settled(ctx, outcomeAck, 1)
		case actFail:
			d.settled(ctx, outcomeFail, 1)
		case actRetry:
			d.settled(ctx, outcomeRetry, 1)
		case actDeadLetter:
			d.settled(ctx, outcomeDeadLetter, 1)
		case actInterrupt:
			d.settled(ctx, outcomeReleased, 1)
		}
		if sts[i] == stDeadLetter {
			cause := causeRetryLimit
			if r.act == actDeadLetter {
				cause = causeRequested
			}
			d.deadLettered(ctx, cause, 1)
		}
	}
}

// errorType is a handler error's error.type: "panic" for a recovered
// panic, context.DeadlineExceeded for a HandlerTimeout, else the error's Go
// type, a value of low cardinality as the conventions ask.
func errorType(err error) string {
	switch {
	case errors.Is(err, ErrPanic):
		return "panic"
	case errors.Is(err, context.DeadlineExceeded):
		return "context.DeadlineExceeded"
	case errors.Is(err, context.Canceled):
		return "context.Canceled"
	}
	return reflect.TypeOf(err).String()
}

// registerSpoolMetrics registers the spool depth and drain gauges.
func registerSpoolMetrics(e *engine) (metric.Registration, error) {
	m := e.cfg.MeterProvider.Meter("github.com/e03140bc/queen")
	pending, err := m.Int64ObservableGauge("queen.spool.pending.records", metric.WithUnit("{record}"), metric.WithDescription("Records in the disk spool not yet replayed."))
	if err != nil {
		return nil, err
	}
	bytes, err := m.Int64ObservableGauge("queen.spool.pending.size", metric.WithUnit("By"))
	if err != nil {
		return nil, err
	}
	quarantined, err := m.Int64ObservableGauge("queen.spool.quarantined.files", metric.WithUnit("{file}"))
	if err != nil {
		return nil, err
	}
	replayed, err := m.Int64ObservableCounter("queen.spool.replayed", metric.WithUnit("{record}"), metric.WithDescription("Records replayed from the disk spool."))
	if err != nil {
		return nil, err
	}
	qrecords, err := m.Int64ObservableCounter("queen.spool.quarantined.records", metric.WithUnit("{record}"),
		metric.WithDescription("Spooled records set aside on their own because their replay kept failing permanently."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := e.spool.Stats()
		o.ObserveInt64(pending, s.PendingRecords)
		o.ObserveInt64(bytes, s.PendingBytes)
		o.ObserveInt64(quarantined, int64(s.QuarantinedFiles))
		o.ObserveInt64(replayed, e.drain.replayed.Load())
		o.ObserveInt64(qrecords, s.QuarantinedRecords)
		return nil
	}, pending, bytes, quarantined, replayed, qrecords)
}
