package queen_test

import (
	"fmt"
	"testing"
	"time"
)

// inWindow runs round with a growing time window until one round's timed
// steps fit inside it. A loaded machine can stretch the steps that must land
// inside a short window (a push, a maintenance pass) past its end; that voids
// the round, never the assertion, so the round is run again with a window
// four times as long. round gets a fresh name to use for its queue and
// reports false when it saw that its steps outlasted the window; it makes its
// assertions only on rounds that fit.
func inWindow(t *testing.T, window time.Duration, round func(name string, window time.Duration) (fit bool)) {
	t.Helper()
	for i := range 4 {
		if round(fmt.Sprintf("q%d", i), window) {
			return
		}
		t.Logf("round %d: the steps outlasted the %v window; again with %v", i, window, 4*window)
		window *= 4
	}
	t.Fatalf("no round's steps fit in a window of up to %v", window/4)
}
