package queen_test

import (
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/e03140bc/queen"
)

// namingProvider records the name and unit of every instrument a client
// creates.
type namingProvider struct {
	noop.MeterProvider
	mu    sync.Mutex
	units map[string]string
}

func (p *namingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return namingMeter{p: p} }

func (p *namingProvider) add(name, unit string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.units[name] = unit
}

type namingMeter struct {
	noop.Meter
	p *namingProvider
}

func (m namingMeter) Int64Counter(n string, o ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	m.p.add(n, metric.NewInt64CounterConfig(o...).Unit())
	return m.Meter.Int64Counter(n, o...)
}

func (m namingMeter) Int64Histogram(n string, o ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	m.p.add(n, metric.NewInt64HistogramConfig(o...).Unit())
	return m.Meter.Int64Histogram(n, o...)
}

func (m namingMeter) Float64Histogram(n string, o ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	m.p.add(n, metric.NewFloat64HistogramConfig(o...).Unit())
	return m.Meter.Float64Histogram(n, o...)
}

func (m namingMeter) Int64ObservableGauge(n string, o ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	m.p.add(n, metric.NewInt64ObservableGaugeConfig(o...).Unit())
	return m.Meter.Int64ObservableGauge(n, o...)
}

func (m namingMeter) Float64ObservableGauge(n string, o ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	m.p.add(n, metric.NewFloat64ObservableGaugeConfig(o...).Unit())
	return m.Meter.Float64ObservableGauge(n, o...)
}

func (m namingMeter) Int64ObservableCounter(n string, o ...metric.Int64ObservableCounterOption) (metric.Int64ObservableCounter, error) {
	m.p.add(n, metric.NewInt64ObservableCounterConfig(o...).Unit())
	return m.Meter.Int64ObservableCounter(n, o...)
}

// Every instrument a client creates has a dotted OpenTelemetry name (queen's
// own under "queen.", the semantic conventions' under "messaging."), a
// unit, and a row in README's table with that unit; and the table lists
// nothing the client does not create.
func TestMetricNamesOneConvention(t *testing.T) {
	p := &namingProvider{units: map[string]string{}}
	c := open(t, func(c *queen.Config) { c.MeterProvider = p })
	_ = c // the instruments are created at Open, maintenance's included
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `((?:queen|messaging)\\.[a-z_.]+)` \\| [a-z]+(?:, ([^ |]+))? \\|")
	listed := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		listed[m[1]] = m[2]
	}
	name := regexp.MustCompile(`^(queen|messaging)(\.[a-z][a-z_]*)+$`)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.units) < 15 {
		t.Fatalf("only %d instruments recorded: %v", len(p.units), p.units)
	}
	t.Logf("%d instruments: %v", len(p.units), p.units)
	for n, u := range p.units {
		if !name.MatchString(n) {
			t.Errorf("instrument %q: not a dotted lower-case name under queen. or messaging.", n)
		}
		if u == "" {
			t.Errorf("instrument %q has no unit", n)
		}
		lu, ok := listed[n]
		switch {
		case !ok:
			t.Errorf("instrument %q is not in README's table", n)
		case lu != u:
			t.Errorf("instrument %q: README says unit %q, the code %q", n, lu, u)
		}
		if strings.Contains(n, "..") {
			t.Errorf("instrument %q: empty name segment", n)
		}
	}
	for n := range listed {
		if _, ok := p.units[n]; !ok {
			t.Errorf("README lists %q, which the client does not create", n)
		}
	}
}
