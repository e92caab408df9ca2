// Package backoff holds the jittered wait shared by the engine's retry
// loops (the listener's reconnects, Consume's claims, the spool drain).
package backoff

import (
	"math/rand/v2"
	"time"
)

// Jitter returns a wait drawn uniformly from [d/2, d]: processes that
// failed together (a database restart) then retry spread out instead of in
// lockstep, and each still waits at least half its backoff.
func Jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}
