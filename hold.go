package queen

import (
	"context"
	"sync/atomic"
	"time"
)

// holdWatch bounds how long one leased batch keeps its lease renewed
// without a handler starting (ConsumeOptions.MaxHold). The renewer reads
// it; the handlers stamp it as they start.
type holdWatch struct {
	limit  time.Duration
	ctx    context.Context // the batch's handlers' context
	cancel context.CancelFunc
	last   atomic.Int64 // Unix ns of the latest handler start
}

// newHold returns the batch's hold watch, or nil when MaxHold is off, with
// the context the batch's handlers run under.
func (c *consumer) newHold() (*holdWatch, context.Context) {
	if c.maxHold <= 0 {
		return nil, c.work
	}
	h := &holdWatch{limit: c.maxHold}
	h.ctx, h.cancel = context.WithCancel(c.work)
	h.last.Store(time.Now().UnixNano())
	return h, h.ctx
}

// started stamps a handler's start at now (Unix ns).
func (h *holdWatch) started(now int64) {
	if h != nil {
		h.last.Store(now)
	}
}

// deadline is when the batch has gone MaxHold without a handler start.
func (h *holdWatch) deadline() time.Time {
	return time.Unix(0, h.last.Load()).Add(h.limit)
}

// end releases the batch's context once its handlers are done.
func (h *holdWatch) end() {
	if h != nil {
		h.cancel()
	}
}
