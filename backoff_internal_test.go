package queen

import (
	"testing"
	"time"
)

func TestBackoffJitterSpreadsWithinBounds(t *testing.T) {
	const d = 100 * time.Millisecond
	seen := map[time.Duration]bool{}
	for range 200 {
		w := backoffJitter(d)
		if w < d/2 || w > d {
			t.Fatalf("backoffJitter(%s) = %s, outside [%s, %s]", d, w, d/2, d)
		}
		seen[w] = true
	}
	if len(seen) < 10 {
		t.Fatalf("backoffJitter drew only %d distinct waits in 200: not jittered", len(seen))
	}
	if backoffJitter(0) != 0 {
		t.Fatal("backoffJitter(0) != 0")
	}
}
