package spool

import (
	"context"
	"testing"
)

// PendingRouted finds a partition's pending records with a Key by the lane
// count they were routed with, after a restart too, and stops finding them
// once they are replayed.
func TestPendingRouted(t *testing.T) {
	dir := t.TempDir()
	route := func(n uint32) string {
		if n == 64 {
			return "lane-33"
		}
		return "lane-1"
	}
	s := openT(t, dir)
	if _, _, ok := s.PendingRouted(testTenant, "orders", route); ok {
		t.Fatal("found in an empty spool")
	}
	r := rec(0, 0)
	r.Partition, r.Key, r.Lanes = "lane-33", "customer-42", 64
	plain := rec(1, 0)
	plain.Partition = "lane-1" // no key: not routed
	appendAll(t, s, []Record{r, plain})
	check := func(s *Spool) {
		t.Helper()
		part, n, ok := s.PendingRouted(testTenant, "orders", route)
		if !ok || part != "lane-33" || n != 64 {
			t.Fatalf("PendingRouted = %q, %d, %v; want lane-33, 64, true", part, n, ok)
		}
		if _, _, ok := s.PendingRouted(testTenant, "other", route); ok {
			t.Fatal("found for another queue")
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir)
	check(s)
	var c collector
	if _, err := s.Replay(context.Background(), c.fn); err != nil {
		t.Fatal(err)
	}
	if part, n, ok := s.PendingRouted(testTenant, "orders", route); ok {
		t.Fatalf("PendingRouted = %q, %d after the replay", part, n)
	}
}
