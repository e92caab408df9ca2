//go:build unix

package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// result is one scenario's row.
type result struct {
	Key   string `json:"key"`
	Name  string `json:"name"`
	Queen bool   `json:"queen"` // false: a baseline
	// Msgs is what the scenario completed; Target what it set out to do.
	Msgs    int64   `json:"messages"`
	Target  int64   `json:"target"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"msgs_per_sec"`
	// Latency is of one call (push, COPY, INSERT, InsertMany) or, for the
	// end-to-end scenario, from the scheduled push to the handler.
	LatencyOf  string  `json:"latency_of,omitempty"`
	P50ms      float64 `json:"p50_ms,omitempty"`
	P99ms      float64 `json:"p99_ms,omitempty"`
	GoCPU      float64 `json:"go_cpu_s"`
	PGCPU      float64 `json:"pg_cpu_s"` // -1: not measured (existing server)
	GoCPUPerM  float64 `json:"go_cpu_s_per_million"`
	PGCPUPerM  float64 `json:"pg_cpu_s_per_million"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	Capped     bool    `json:"capped"` // -max-time stopped it before Target
	// Offered is the fixed offered rate (msgs/s) of an open-loop scenario.
	Offered float64 `json:"offered_msgs_per_sec,omitempty"`
	// PacedAt is the rate of a paced baseline (insert-paced): its calls
	// start on the open loop's schedule, not back to back.
	PacedAt float64 `json:"paced_msgs_per_sec,omitempty"`
	// KeptUp (open-loop scenarios): every message was handled and the last
	// handler started within a second of the last scheduled send, LagMs
	// after it.
	KeptUp *bool   `json:"kept_up,omitempty"`
	LagMs  float64 `json:"lag_ms,omitempty"`
	Note   string  `json:"note,omitempty"`
	// Unavailable says why the scenario has no numbers.
	Unavailable string `json:"unavailable,omitempty"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fmtMs(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v < 1:
		return fmt.Sprintf("%.0f µs", v*1000)
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	case v < 100:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.0f ms", v)
	}
}

func fmtInt(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fmtCPU(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", v)
}

// printRow is the progress line printed as each scenario ends.
func printRow(r *result) {
	if r.Unavailable != "" {
		fmt.Printf("%-58s not available: %s\n", r.Name, r.Unavailable)
		return
	}
	capped := ""
	if r.Capped {
		capped = " (capped by -max-time)"
		if r.Offered > 0 {
			capped = " (capped: not all handled 10 s after the last send)"
		}
	}
	lat := ""
	if r.P50ms > 0 {
		lat = fmt.Sprintf("  p50 %s p99 %s", fmtMs(r.P50ms), fmtMs(r.P99ms))
	}
	fmt.Printf("%-66s %10s msgs/s %10s msgs in %5.1fs%s%s\n", r.Name, fmtInt(r.Rate), fmtInt(float64(r.Msgs)), r.Seconds, lat, capped)
	if r.Note != "" {
		fmt.Printf("  %s\n", r.Note)
	}
}

// printTable writes the results as a Markdown table.
func printTable(w io.Writer, rs []*result) {
	fmt.Fprintln(w, "| scenario | messages | msgs/s | p50 | p99 | Go CPU s / 1M msgs | PostgreSQL CPU s / 1M msgs | peak RSS MiB |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		if r.Unavailable != "" {
			fmt.Fprintf(w, "| %s | not available: %s | | | | | | |\n", r.Name, r.Unavailable)
			continue
		}
		n := fmtInt(float64(r.Msgs))
		if r.Capped {
			n += " (capped)"
		}
		name := r.Name
		if r.Queen {
			name = "**" + name + "**"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %.0f |\n", name, n, fmtInt(r.Rate),
			fmtMs(r.P50ms), fmtMs(r.P99ms), fmtCPU(r.GoCPUPerM), fmtCPU(r.PGCPUPerM), r.PeakRSSMiB)
	}
}

type ratio struct {
	What  string  `json:"what"`
	Queen string  `json:"queen"`
	Base  string  `json:"baseline"`
	Ratio float64 `json:"ratio"` // msgs/s of queen / msgs/s of the baseline
	// CPURatio is the baseline's CPU seconds per message (Go process plus
	// PostgreSQL) over queen's: how many times less CPU queen spends per
	// message. It moves less with other load on a shared machine than
	// throughput does. 0 when the server's CPU is unknown.
	CPURatio float64 `json:"cpu_ratio,omitempty"`
}

// ratios compares throughput (msgs/s) of each queen scenario with the
// baselines of the same shape, within this run.
func ratios(rs []*result) []ratio {
	by := map[string]*result{}
	for _, r := range rs {
		if r.Unavailable == "" && r.Rate > 0 {
			by[r.Key] = r
		}
	}
	pairs := [][2]string{
		{"single", "insert"},
		{"batch", "copy"},
		{"batch", "insert"},
		{"batch", "river-insert"},
		{"wide", "copy"},
		{"mixed", "copy-one"},
		{"mixed", "copy"},
		{"wide", "river-insert"},
		{"drain", "river-drain"},
		{"single", "pgq-single"},
		{"batch", "pgq-copy"},
		{"batch", "pgq-insert-batch"},
		{"drain", "pgq-drain"},
	}
	var out []ratio
	for _, p := range pairs {
		q, bl := by[p[0]], by[p[1]]
		if q == nil || bl == nil {
			continue
		}
		r := ratio{What: q.Name + " / " + bl.Name, Queen: p[0], Base: p[1], Ratio: q.Rate / bl.Rate}
		if q.PGCPUPerM >= 0 && bl.PGCPUPerM >= 0 && q.GoCPUPerM+q.PGCPUPerM > 0 {
			r.CPURatio = (bl.GoCPUPerM + bl.PGCPUPerM) / (q.GoCPUPerM + q.PGCPUPerM)
		}
		out = append(out, r)
	}
	return out
}

func printRatios(w io.Writer, rs []*result) {
	fmt.Fprintln(w, "| queen / baseline (same run) | throughput ratio | CPU per message, baseline / queen |")
	fmt.Fprintln(w, "|---|---:|---:|")
	for _, r := range ratios(rs) {
		cpu := "n/a"
		if r.CPURatio > 0 {
			cpu = fmt.Sprintf("%.2f×", r.CPURatio)
		}
		fmt.Fprintf(w, "| %s | %.2f× | %s |\n", r.What, r.Ratio, cpu)
	}
}

// printE2E writes the end-to-end rows as a Markdown table, queen and River
// side by side at each offered rate.
func printE2E(w io.Writer, rs []*result) {
	type pair struct{ q, r *result }
	var rates []float64
	by := map[float64]*pair{}
	var pgq []*result
	for _, r := range rs {
		if r.Offered == 0 || r.Unavailable != "" {
			continue
		}
		if strings.HasPrefix(r.Key, "pgq-") {
			pgq = append(pgq, r)
			continue
		}
		p := by[r.Offered]
		if p == nil {
			p = &pair{}
			by[r.Offered] = p
			rates = append(rates, r.Offered)
		}
		if r.Queen {
			p.q = r
		} else {
			p.r = r
		}
	}
	cell := func(r *result) string {
		if r == nil {
			return "- | - | -"
		}
		kept := "yes"
		if r.KeptUp != nil && !*r.KeptUp {
			kept = fmt.Sprintf("no (%s of %s handled, %s behind)", fmtInt(float64(r.Msgs)), fmtInt(float64(r.Target)), fmtMs(r.LagMs))
		}
		return fmt.Sprintf("%s | %s | %s", fmtMs(r.P50ms), fmtMs(r.P99ms), kept)
	}
	if len(rates) > 0 {
		fmt.Fprintln(w, "| offered msgs/s | queen p50 | queen p99 | queen kept up | River p50 | River p99 | River kept up |")
		fmt.Fprintln(w, "|---:|---:|---:|---|---:|---:|---|")
		for _, rate := range rates {
			p := by[rate]
			fmt.Fprintf(w, "| %s | %s | %s |\n", fmtInt(rate), cell(p.q), cell(p.r))
		}
		// The yardsticks of a low rate's latency: one commit, same run,
		// back to back (insert-one) and paced at the end-to-end rate
		// (insert-paced: client and server idle between commits, as the
		// end-to-end scenario's are).
		for _, r := range rs {
			if (r.Key != "insert-one" && r.Key != "insert-paced") || r.Unavailable != "" || r.P50ms <= 0 {
				continue
			}
			how := "back to back"
			if r.Key == "insert-paced" {
				how = "paced at " + fmtInt(r.PacedAt) + " msgs/s"
			}
			for _, rate := range rates {
				if q := by[rate].q; q != nil && (r.PacedAt == 0 || r.PacedAt == rate) {
					fmt.Fprintf(w, "\nqueen p50 at %s msgs/s / single-row INSERT commit p50, %s (%s): %.2f×\n",
						fmtInt(rate), how, fmtMs(r.P50ms), q.P50ms/r.P50ms)
				}
			}
		}
	}
	if len(pgq) > 0 {
		if len(rates) > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "| PgQ end to end | offered msgs/s | p50 | p99 | kept up |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---|")
		for _, r := range pgq {
			fmt.Fprintf(w, "| %s | %s | %s |\n", r.Name, fmtInt(r.Offered), cell(r))
		}
	}
}
