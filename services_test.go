package queen_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

var errInstrument = errors.New("test: instrument refused")

// refusingMeters is a no-op MeterProvider whose meters refuse to create the
// observable gauge named fail.
type refusingMeters struct {
	noop.MeterProvider
	fail string
}

func (p refusingMeters) Meter(string, ...metric.MeterOption) metric.Meter {
	return refusingMeter{fail: p.fail}
}

type refusingMeter struct {
	noop.Meter
	fail string
}

func (m refusingMeter) Int64ObservableGauge(name string, opts ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	if name == m.fail {
		return nil, errInstrument
	}
	return m.Meter.Int64ObservableGauge(name, opts...)
}

// TestOpenFailureStopsWhatStarted: when a service fails to start (here a
// metric instrument registered early, midway and last), Open returns its
// error and stops every service it had started: no goroutine is left, and
// the spool directory is free for the next Open.
func TestOpenFailureStopsWhatStarted(t *testing.T) {
	schema := pgtest.Schema(t)
	for _, gauge := range []string{"queen.consumer.lag", "queen.queue.dead_letters", "queen.spool.pending.records", "queen.client.keys.in_flight"} {
		t.Run(gauge, func(t *testing.T) {
			dir := t.TempDir()
			cfg := queen.Config{DatabaseURL: pgtest.URL(t), Schema: schema, Logger: pgtest.Logger(t), SpoolDir: dir}
			ignore := goleak.IgnoreCurrent()
			bad := cfg
			bad.MeterProvider = refusingMeters{fail: gauge}
			c, err := queen.Open(ctxT(t), bad)
			if !errors.Is(err, errInstrument) {
				if c != nil {
					_ = c.Close(context.Background())
				}
				t.Fatalf("Open: %v, want %v", err, errInstrument)
			}
			if err := goleak.Find(ignore); err != nil {
				t.Fatalf("goroutines left by the failed Open: %v", err)
			}
			c, err = queen.Open(ctxT(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := c.Close(context.Background()); err != nil {
					t.Error(err)
				}
			}()
			if got := c.SpoolStats().Dir; got != dir {
				t.Fatalf("spool dir %s, want %s: the failed Open kept its lock", got, dir)
			}
		})
	}
}
