//go:build unix

package main

import (
	"strings"
	"testing"
)

func TestStealPct(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	a := []int64{100, 0, 50, 800, 10, 0, 0, 40, 30, 0}
	b := []int64{160, 0, 70, 900, 10, 0, 0, 60, 60, 0}
	// Over the interval: 60+20+100+20 = 200 ticks (guest, already in user,
	// is not counted twice), 20 of them steal.
	if got := stealPct(a, b); got != 10 {
		t.Errorf("stealPct = %v, want 10", got)
	}
	if got := stealPct(nil, b); got != -1 {
		t.Errorf("stealPct without a start = %v, want -1", got)
	}
	if got := stealPct(a, a); got != -1 {
		t.Errorf("stealPct over no time = %v, want -1", got)
	}
}

func TestProbeSync(t *testing.T) {
	p := probeSync(t.TempDir())
	if p.Err != "" {
		t.Fatal(p.Err)
	}
	if p.Ops != syncProbeOps || p.PerSec <= 0 || p.P50us <= 0 || p.P99us < p.P50us {
		t.Errorf("probe = %+v", p)
	}
	if p := probeSync("/nonexistent/dir"); p.Err == "" || !strings.Contains(p.String(), "failed") {
		t.Errorf("probe of a missing dir = %+v, %s", p, p)
	}
}
