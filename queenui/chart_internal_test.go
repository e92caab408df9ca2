package queenui

import (
	"encoding/binary"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func at(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }

// TestChartPath: the window's ends map to the box's edges, 0 to the bottom
// and top to the top; gaps and points outside the window break the line,
// a lone point is a dot, and values beyond the axis are clamped.
func TestChartPath(t *testing.T) {
	from, to := at(0), at(60)
	for _, tc := range []struct {
		name string
		pts  []point
		want string
	}{
		{"empty ring", nil, ""},
		{"one point", []point{{at(30), 5}}, "M50 5 l0 0"},
		{"a line", []point{{at(0), 0}, {at(30), 10}, {at(60), 5}}, "M0 10 L50 0 L100 5"},
		{"a gap", []point{{at(0), 0}, {at(6), 0}, {at(12), math.NaN()}, {at(18), 10}, {at(24), 10}},
			"M0 10 L10 10 M30 0 L40 0"},
		{"a lone point between gaps", []point{{at(0), 0}, {at(6), math.NaN()}, {at(12), 5}, {at(18), math.Inf(1)}},
			"M0 10 l0 0 M20 5 l0 0"},
		{"huge and negative values", []point{{at(0), 1e300}, {at(60), -3}}, "M0 0 L100 10"},
		{"outside the window", []point{{at(-5), 3}, {at(0), 3}, {at(61), 3}}, "M0 7 l0 0"},
	} {
		if got := chartPath(tc.pts, from, to, 10, 100, 10); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := chartPath([]point{{at(1), 1}}, to, from, 10, 100, 10); got != "" {
		t.Errorf("an inverted window: %q, want none", got)
	}
	if got := chartPath([]point{{at(0), 1}}, from, to, 0, 100, 10); got != "M0 0 l0 0" {
		t.Errorf("a zero axis: %q, want the axis at 1", got)
	}
}

// TestRatesOf: rates between successive totals at the later time; a drop
// (a counter reset), a missing total or a gap longer than maxGap is NaN.
func TestRatesOf(t *testing.T) {
	if got := ratesOf([]time.Time{at(0)}, []int64{5}, []bool{true}, time.Hour); got != nil {
		t.Fatalf("one sample: %v, want no rate", got)
	}
	times := []time.Time{at(0), at(1), at(2), at(3), at(10), at(11), at(12)}
	totals := []int64{0, 60, 180, 120, 180, 240, 300}
	known := []bool{true, true, true, true, true, true, false}
	got := ratesOf(times, totals, known, 2*time.Minute)
	want := []float64{1, 2, math.NaN(), math.NaN(), 1, math.NaN()}
	if len(got) != len(want) {
		t.Fatalf("%d rates, want %d", len(got), len(want))
	}
	for i, p := range got {
		if !p.At.Equal(times[i+1]) || (math.IsNaN(want[i]) != math.IsNaN(p.V)) || (!math.IsNaN(want[i]) && p.V != want[i]) {
			t.Errorf("rate %d = %v at %v, want %v at %v", i, p.V, p.At, want[i], times[i+1])
		}
	}
}

func TestNiceMax(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want float64
	}{{0, 1}, {0.3, 1}, {1, 1}, {1.5, 2}, {3, 5}, {7, 10}, {10, 10}, {11, 20}, {4200, 5000}, {math.NaN(), 1}} {
		if got := niceMax([]point{{at(0), tc.v}}); got != tc.want {
			t.Errorf("niceMax(%v) = %v, want %v", tc.v, got, tc.want)
		}
	}
	for v, want := range map[float64]string{1: "1", 500: "500", 2000: "2k", 2500: "2.5k", 5e6: "5M", 1e13: "10T"} {
		if got := axisLabel(v); got != want {
			t.Errorf("axisLabel(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestQueueCharts: pushed and settled rates and a lag line per group over
// the window ending at the database's now; no samples: empty charts.
func TestQueueCharts(t *testing.T) {
	empty := queueCharts(queen.QueueSamples{Now: at(60), Interval: time.Minute})
	if len(empty) != 2 || !empty[0].Empty || !empty[1].Empty || len(empty[1].Series) != 0 {
		t.Fatalf("charts of no samples: %+v", empty)
	}
	s := queen.QueueSamples{Now: at(60), Interval: time.Minute}
	for i := range 61 {
		s.Samples = append(s.Samples, queen.Sample{At: at(i), Pushed: int64(120 * i),
			Groups: []queen.GroupSample{{Group: "", Consumed: int64(60 * i), Lag: int64(60 * i)}, {Group: "b", Consumed: 0, Lag: 5}}})
	}
	cs := queueCharts(s)
	tp, lag := cs[0], cs[1]
	if tp.Empty || tp.Max != "2" || tp.Unit != "/s" || tp.Series[0].Last != "2.0/s" || tp.Series[1].Last != "1.0/s" {
		t.Fatalf("throughput chart: %+v", tp)
	}
	// Pushed at 2/s on an axis to 2: the top line, from the first rate on.
	if !strings.HasPrefix(tp.Series[0].D, "M10 0 L20 0 ") || !strings.HasSuffix(tp.Series[0].D, "L600 0") {
		t.Fatalf("pushed path %q", tp.Series[0].D)
	}
	if lag.Max != "5k" || len(lag.Series) != 2 || lag.Series[0].Name != "(queue mode)" || lag.Series[0].Last != "3600" ||
		lag.Series[1].Name != "b" || lag.Series[1].Last != "5" || lag.Span != "60 min" {
		t.Fatalf("lag chart: %+v", lag)
	}
	if !strings.HasPrefix(lag.Series[0].D, "M0 120 L10 ") {
		t.Fatalf("lag path %q", lag.Series[0].D)
	}
}

var pathSyntax = regexp.MustCompile(`^(M[0-9.]+ [0-9.]+( L[0-9.]+ [0-9.]+)*( l0 0)?)?( M[0-9.]+ [0-9.]+( L[0-9.]+ [0-9.]+)*( l0 0)?)*$`)

// FuzzChartPath: whatever the samples (gaps, NaN, infinities, huge or
// negative values, times in any order, a counter reset), the path is well
// formed and stays inside the box.
func FuzzChartPath(f *testing.F) {
	f.Add([]byte{}, 10.0)
	f.Add(binary.LittleEndian.AppendUint64([]byte{3}, math.Float64bits(math.NaN())), 1.0)
	f.Add(binary.LittleEndian.AppendUint64([]byte{200}, math.Float64bits(-1e308)), 0.0)
	f.Fuzz(func(t *testing.T, data []byte, top float64) {
		var pts []point
		var totals []int64
		var times []time.Time
		for len(data) >= 9 {
			ts := at(int(int8(data[0])))
			v := math.Float64frombits(binary.LittleEndian.Uint64(data[1:9]))
			data = data[9:]
			pts = append(pts, point{At: ts, V: v})
			times = append(times, ts)
			totals = append(totals, int64(v)) // resets and jumps included
		}
		known := make([]bool, len(times))
		for i := range known {
			known[i] = true
		}
		rates := ratesOf(times, totals, known, 2*time.Minute)
		for _, p := range rates {
			if p.V < 0 || math.IsInf(p.V, 0) {
				t.Fatalf("rate %v: a reset must be a gap", p.V)
			}
		}
		for _, ps := range [][]point{pts, rates} {
			for _, axis := range []float64{top, niceMax(ps)} {
				d := chartPath(ps, at(0), at(60), axis, chartW, chartH)
				if !pathSyntax.MatchString(d) {
					t.Fatalf("path %q is malformed", d)
				}
				for i, f := range strings.FieldsFunc(d, func(r rune) bool { return r == 'M' || r == 'L' || r == 'l' || r == ' ' }) {
					v, err := strconv.ParseFloat(f, 64)
					lim := chartW
					if i%2 == 1 {
						lim = chartH
					}
					if err != nil || v < 0 || v > lim {
						t.Fatalf("path %q: coordinate %q outside 0..%v", d, f, lim)
					}
				}
			}
		}
	})
}
