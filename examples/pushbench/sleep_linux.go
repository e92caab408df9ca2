package main

import (
	"syscall"
	"time"
)

// sleepUntil sleeps until t with nanosleep(2), as examples/bench's open loop
// does (time.Sleep woke about 0.5 ms late on the benchmark VM).
func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		ts := syscall.NsecToTimespec(int64(d))
		_ = syscall.Nanosleep(&ts, nil)
	}
}
