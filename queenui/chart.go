package queenui

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/e03140bc/queen"
)

// The charts are server-side SVG: a path per series over a fixed window
// (the samples ring's hour, ending at the database's now), drawn in a
// viewBox of chartW x chartH user units that CSS scales to the page.
const (
	chartW = 600.0
	chartH = 120.0
)

// point is a value at a time; NaN (or ±Inf) where it is not known: a gap.
type point struct {
	At time.Time
	V  float64
}

// ratesOf turns running totals, sampled at at, into per-second rates
// between successive samples, each at the later one's time. An interval
// longer than maxGap (passes were missed), a total that went down (a
// purged partition or a reset group: a counter reset, not negative
// throughput) or one not known at either end gives NaN, so the line
// breaks rather than bridging it.
func ratesOf(at []time.Time, totals []int64, known []bool, maxGap time.Duration) []point {
	if len(at) < 2 {
		return nil
	}
	out := make([]point, 0, len(at)-1)
	for i := 1; i < len(at); i++ {
		p := point{At: at[i], V: math.NaN()}
		dt := at[i].Sub(at[i-1])
		if known[i] && known[i-1] && dt > 0 && dt <= maxGap && totals[i] >= totals[i-1] {
			// In float64: the int64 difference of far-apart totals overflows.
			p.V = (float64(totals[i]) - float64(totals[i-1])) / dt.Seconds()
		}
		out = append(out, p)
	}
	return out
}

// chartPath renders pts as the d attribute of an SVG path in a w x h box:
// from at the left edge, to at the right, 0 at the bottom and top at the
// top (values above it are drawn at the top, negative ones at 0). A point
// outside [from, to] or without a finite value breaks the line; a point
// with no neighbour is drawn as a dot (a zero-length segment, which a
// round line cap shows). No points, or an empty window: "".
func chartPath(pts []point, from, to time.Time, top, w, h float64) string {
	span := to.Sub(from)
	if span <= 0 || !(w > 0) || !(h > 0) || math.IsInf(w, 0) || math.IsInf(h, 0) {
		return ""
	}
	if !(top > 0) || math.IsInf(top, 0) {
		top = 1
	}
	var parts []string
	drawing := false // the previous point was drawn: continue its line
	lone := false    // the current run has one point so far
	for _, p := range pts {
		if p.At.Before(from) || p.At.After(to) || math.IsNaN(p.V) || math.IsInf(p.V, 0) {
			if drawing && lone {
				parts = append(parts, "l0 0")
			}
			drawing = false
			continue
		}
		x := w * float64(p.At.Sub(from)) / float64(span)
		v := min(max(p.V, 0), top)
		cmd := "M"
		if drawing {
			cmd = "L"
		}
		// v/top first: h*v overflows for v near MaxFloat64.
		parts = append(parts, cmd+coord(x)+" "+coord(h-h*(v/top)))
		lone, drawing = !drawing, true
	}
	if drawing && lone {
		parts = append(parts, "l0 0")
	}
	return strings.Join(parts, " ")
}

// coord prints a coordinate to a tenth of a unit.
func coord(v float64) string { return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) }

// niceMax rounds the largest value up to 1, 2 or 5 times a power of ten,
// at least 1, so the axis label is a round number.
func niceMax(pts ...[]point) float64 {
	m := 0.0
	for _, s := range pts {
		for _, p := range s {
			if !math.IsNaN(p.V) && !math.IsInf(p.V, 0) {
				m = max(m, p.V)
			}
		}
	}
	if m <= 1 {
		return 1
	}
	if m > math.MaxFloat64/10 {
		return m
	}
	e := math.Pow(10, math.Floor(math.Log10(m)))
	for _, f := range []float64{1, 2, 5, 10} {
		if f*e >= m {
			return f * e
		}
	}
	return 10 * e
}

// axisLabel prints an axis maximum: "5", "2.5k", "3M".
func axisLabel(v float64) string {
	for _, u := range []struct {
		div    float64
		suffix string
	}{{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= u.div {
			return strconv.FormatFloat(v/u.div, 'g', 3, 64) + u.suffix
		}
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// chart is what the chart template draws.
type chart struct {
	ID     string
	Title  string
	Unit   string // of the axis label: "/s" or ""
	Max    string // the top of the axis, labelled
	Span   string // the window: "60 min"
	Series []series
	Empty  bool // no series has a point: say so instead
	W, H   float64
	Mid    float64 // the half-way grid line's y
}

type series struct {
	Name  string
	Class string // the colour, from app.css
	D     string // the path
	Last  string // the newest value, for the legend
}

// queueCharts builds the queue page's two charts from its samples:
// messages pushed and settled per second, and each group's lag.
func queueCharts(s queen.QueueSamples) []chart {
	window := s.Interval * queen.SamplesKept
	from, to := s.Now.Add(-window), s.Now
	// Passes run about every second, so a sample is at most a little late;
	// twice the interval apart means at least one is missing.
	maxGap := 2 * s.Interval
	n := len(s.Samples)
	at := make([]time.Time, n)
	pushed := make([]int64, n)
	settled := make([]int64, n)
	all := make([]bool, n)
	var groups []string
	seen := map[string]bool{}
	for i, x := range s.Samples {
		at[i], pushed[i], all[i] = x.At, x.Pushed, true
		for _, g := range x.Groups {
			settled[i] += g.Consumed
			if !seen[g.Group] {
				seen[g.Group] = true
				groups = append(groups, g.Group)
			}
		}
	}
	push := ratesOf(at, pushed, all, maxGap)
	// The sum over groups changes meaning when a group appears or goes:
	// only intervals with the same groups at both ends count.
	same := make([]bool, n)
	for i := range s.Samples {
		same[i] = i == 0 || sameGroups(s.Samples[i-1].Groups, s.Samples[i].Groups)
	}
	settle := ratesOf(at, settled, all, maxGap)
	for i := range settle {
		if !same[i+1] {
			settle[i].V = math.NaN()
		}
	}
	top := niceMax(push, settle)
	tp := chart{ID: "chart-throughput", Title: "Throughput", Unit: "/s", Max: axisLabel(top), W: chartW, H: chartH}
	tp.Series = []series{
		{Name: "pushed", Class: "s0", D: chartPath(push, from, to, top, chartW, chartH), Last: lastRate(push)},
		{Name: "settled (all groups)", Class: "s1", D: chartPath(settle, from, to, top, chartW, chartH), Last: lastRate(settle)},
	}

	// Lag is a level, not a rate: a point per sample, and a gap where
	// samples are missing or the group had no cursor yet.
	lags := make([][]point, len(groups))
	for k, g := range groups {
		for i, x := range s.Samples {
			if i > 0 && x.At.Sub(s.Samples[i-1].At) > maxGap {
				lags[k] = append(lags[k], point{At: x.At, V: math.NaN()})
			}
			p := point{At: x.At, V: math.NaN()}
			for _, gs := range x.Groups {
				if gs.Group == g {
					p.V = float64(gs.Lag)
				}
			}
			lags[k] = append(lags[k], p)
		}
	}
	top = niceMax(lags...)
	lc := chart{ID: "chart-lag", Title: "Lag per group", Unit: "", Max: axisLabel(top), W: chartW, H: chartH}
	for k, g := range groups {
		last := "–"
		if pts := lags[k]; len(pts) > 0 && !math.IsNaN(pts[len(pts)-1].V) {
			last = strconv.FormatFloat(pts[len(pts)-1].V, 'f', 0, 64)
		}
		lc.Series = append(lc.Series, series{Name: groupName(g), Class: "s" + strconv.Itoa((k+1)%6),
			D: chartPath(lags[k], from, to, top, chartW, chartH), Last: last})
	}
	span := strconv.Itoa(int(window.Round(time.Minute)/time.Minute)) + " min"
	if window < time.Minute {
		span = window.String()
	}
	out := []chart{tp, lc}
	for i := range out {
		out[i].Span, out[i].Mid = span, chartH/2
		out[i].Empty = true
		for _, sr := range out[i].Series {
			if sr.D != "" {
				out[i].Empty = false
			}
		}
	}
	return out
}

func sameGroups(a, b []queen.GroupSample) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Group != b[i].Group {
			return false
		}
	}
	return true
}

func lastRate(pts []point) string {
	if len(pts) == 0 || math.IsNaN(pts[len(pts)-1].V) {
		return "–"
	}
	return rate(pts[len(pts)-1].V)
}
