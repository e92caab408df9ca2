//go:build unix

package main

import (
	"strings"
	"testing"
)

// PgQ's end-to-end rows get a table of their own: in the queen/River table
// they would take River's column.
func TestPrintE2EPgQApart(t *testing.T) {
	yes := true
	rs := []*result{
		{Key: "e2e-1000", Name: "queen e2e", Queen: true, Offered: 1000, P50ms: 1, P99ms: 2, KeptUp: &yes},
		{Key: "river-e2e-1000", Name: "River e2e", Offered: 1000, P50ms: 3, P99ms: 4, KeptUp: &yes},
		{Key: "pgq-e2e-10ms", Name: "PgQ e2e", Offered: 1000, P50ms: 50, P99ms: 60, KeptUp: &yes},
	}
	var sb strings.Builder
	printE2E(&sb, rs)
	out := sb.String()
	var riverRow, pgqRow string
	for line := range strings.SplitSeq(out, "\n") {
		switch {
		case strings.HasPrefix(line, "| 1,000 |"):
			riverRow = line
		case strings.HasPrefix(line, "| PgQ e2e |"):
			pgqRow = line
		}
	}
	if !strings.Contains(riverRow, "3.00 ms") || strings.Contains(riverRow, "50.0 ms") {
		t.Errorf("queen/River row = %q, want River's 3.00 ms and no PgQ figure\n%s", riverRow, out)
	}
	if !strings.Contains(pgqRow, "50.0 ms") {
		t.Errorf("PgQ row = %q\n%s", pgqRow, out)
	}
}

// Both INSERT yardsticks print their own ratio line, each saying which it
// is: back to back (insert-one) and paced at the end-to-end rate
// (insert-paced), the paced one only for the rate it was paced at.
func TestPrintE2EBothInsertYardsticks(t *testing.T) {
	yes := true
	rs := []*result{
		{Key: "insert-one", Name: "INSERT one", P50ms: 0.2, P99ms: 0.5},
		{Key: "insert-paced", Name: "INSERT paced", P50ms: 0.5, P99ms: 1, PacedAt: 100},
		{Key: "e2e-100", Name: "queen e2e 100", Queen: true, Offered: 100, P50ms: 1.5, P99ms: 4, KeptUp: &yes},
		{Key: "e2e-2000", Name: "queen e2e 2000", Queen: true, Offered: 2000, P50ms: 4, P99ms: 9, KeptUp: &yes},
	}
	var sb strings.Builder
	printE2E(&sb, rs)
	out := sb.String()
	want := []string{
		"queen p50 at 100 msgs/s / single-row INSERT commit p50, back to back (200 µs): 7.50×",
		"queen p50 at 100 msgs/s / single-row INSERT commit p50, paced at 100 msgs/s (500 µs): 3.00×",
		"queen p50 at 2,000 msgs/s / single-row INSERT commit p50, back to back (200 µs): 20.00×",
	}
	for _, w := range want {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("missing line %q\n%s", w, out)
		}
	}
	if strings.Contains(out, "2,000 msgs/s / single-row INSERT commit p50, paced") {
		t.Errorf("a paced ratio at a rate the INSERTs were not paced at\n%s", out)
	}
}
