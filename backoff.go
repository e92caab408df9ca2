package queen

import (
	"math/rand/v2"
	"time"
)

// backoffJitter returns a wait drawn uniformly from [d/2, d]: processes
// that failed together (a database restart) then retry spread out instead
// of in lockstep, and each still waits at least half its backoff.
func backoffJitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}
