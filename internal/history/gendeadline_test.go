package history_test

import (
	"context"
	"sync/atomic"
	"time"
)

// genContext is the generators' context. Its deadline is the end of
// generation, known only once setup ends (the run's duration counts from
// there); until then it is the run's duration from now. Generators that
// pace themselves by the time left (deadlineOf) would otherwise read the
// whole run's far deadline, and one looping while time is left spun past
// the end of generation.
type genContext struct {
	context.Context
	dur time.Duration
	end atomic.Int64 // UnixNano; 0 until armed
}

func newGenContext(ctx context.Context, dur time.Duration) (*genContext, context.CancelFunc) {
	c, cancel := context.WithCancel(ctx)
	return &genContext{Context: c, dur: dur}, cancel
}

// arm fixes the deadline at now + dur and ends the context then.
func (c *genContext) arm(cancel context.CancelFunc) *time.Timer {
	c.end.Store(time.Now().Add(c.dur).UnixNano())
	return time.AfterFunc(c.dur, cancel)
}

func (c *genContext) Deadline() (time.Time, bool) {
	if e := c.end.Load(); e != 0 {
		return time.Unix(0, e), true
	}
	return time.Now().Add(c.dur), true
}
