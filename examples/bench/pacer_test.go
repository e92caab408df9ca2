package main

import (
	"testing"
	"time"
)

// The pacer never returns before the time it was given, returns for a time
// already past, and can be used again after each wait.
func TestPacerSleepsUntil(t *testing.T) {
	p := newPacer()
	defer p.close()
	for _, d := range []time.Duration{-time.Millisecond, 0, 50 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, 200 * time.Microsecond} {
		at := time.Now().Add(d)
		p.sleepUntil(at)
		if now := time.Now(); now.Before(at) {
			t.Fatalf("sleepUntil(now%+v) returned %v early", d, at.Sub(now))
		}
	}
	start := time.Now()
	for i := range 20 {
		at := start.Add(time.Duration(i+1) * 500 * time.Microsecond)
		p.sleepUntil(at)
		if now := time.Now(); now.Before(at) {
			t.Fatalf("sleep %d returned %v early", i, at.Sub(now))
		}
	}
}
