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
