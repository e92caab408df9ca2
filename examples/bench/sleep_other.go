//go:build !linux

package main

import "time"

// pacer sleeps the open loop's senders until their sends' times.
type pacer struct{}

func newPacer() *pacer { return &pacer{} }

// sleepUntil returns at t, at once if t has passed.
func (*pacer) sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

func (*pacer) close() {}
