package queen

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// meters are the engine's OpenTelemetry instruments. Counter names come out
// in Prometheus with a _total suffix, matching the seed's names
// (queen_batch_items_fired_total, ...).
type meters struct {
	itemsFired     metric.Int64Counter
	itemsPerBundle metric.Int64Histogram
	commits        metric.Int64Counter
	segments       metric.Int64Counter
	bundleErrors   metric.Int64Counter
	bundleSecs     metric.Float64Histogram
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
		x.itemsFired, e = m.Int64Counter("queen_batch_items_fired", metric.WithDescription("Items sent to PostgreSQL in push bundles."))
		return
	})
	try(func() (e error) {
		x.itemsPerBundle, e = m.Int64Histogram("queen_fusion_items_per_batch", metric.WithDescription("Items per committed push bundle."),
			metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000))
		return
	})
	try(func() (e error) {
		x.commits, e = m.Int64Counter("queen_fusion_commits", metric.WithDescription("Push bundle transactions committed."))
		return
	})
	try(func() (e error) {
		x.segments, e = m.Int64Counter("queen_fusion_segments", metric.WithDescription("Segments committed (one per partition per bundle)."))
		return
	})
	try(func() (e error) {
		x.bundleErrors, e = m.Int64Counter("queen_fusion_bundle_errors", metric.WithDescription("Push bundles that failed as a whole."))
		return
	})
	try(func() (e error) {
		x.bundleSecs, e = m.Float64Histogram("queen_fusion_bundle_duration_seconds", metric.WithUnit("s"),
			metric.WithDescription("Push bundle round trip, from call to commit."))
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
// batch of, from in-process numbers: queen_consume_keys_in_flight (keys
// with a handler running) and queen_consume_keys_paused (keys a failure
// paused in the running batch), with attributes queue, group and partition.
func registerKeyMetrics(e *engine) (metric.Registration, error) {
	m := e.cfg.MeterProvider.Meter("github.com/e03140bc/queen")
	inFlight, err := m.Int64ObservableGauge("queen_consume_keys_in_flight",
		metric.WithDescription("Ordering keys with a handler running, per partition batch this client holds (KeyConcurrency > 1)."))
	if err != nil {
		return nil, err
	}
	paused, err := m.Int64ObservableGauge("queen_consume_keys_paused",
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
