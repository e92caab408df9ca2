package fusion

import (
	"sync"
	"sync/atomic"
	"time"
)

// VegasConfig configures a [Vegas] limiter. Zero fields take their defaults;
// Max below Min is raised to Min, Initial is clamped into [Min, Max] and Beta
// below Alpha is raised to Alpha.
type VegasConfig struct {
	// Alpha is the estimated queue below which the limit grows by one.
	// Defaults to DefaultVegasAlpha.
	Alpha int
	// Beta is the estimated queue above which the limit shrinks by one.
	// Defaults to DefaultVegasBeta.
	Beta int
	// Initial is the starting limit. Defaults to DefaultVegasInitial.
	Initial int
	// Max is the largest limit. Defaults to DefaultVegasMax.
	Max int
	// Min is the smallest limit. Defaults to DefaultVegasMin.
	Min int
	// Window is the number of samples after which the no-load round trip
	// estimate starts forgetting older samples: the baseline is the minimum
	// over the current and the previous window. Defaults to
	// DefaultVegasWindow.
	Window int
}

// The defaults of VegasConfig's zero fields.
const (
	DefaultVegasAlpha   = 2
	DefaultVegasBeta    = 4
	DefaultVegasInitial = 4
	DefaultVegasMax     = 64
	DefaultVegasMin     = 1
	DefaultVegasWindow  = 1000
)

func (c VegasConfig) withDefaults() VegasConfig {
	if c.Alpha <= 0 {
		c.Alpha = DefaultVegasAlpha
	}
	if c.Beta <= 0 {
		c.Beta = DefaultVegasBeta
	}
	c.Beta = max(c.Beta, c.Alpha)
	if c.Min <= 0 {
		c.Min = DefaultVegasMin
	}
	if c.Max <= 0 {
		c.Max = DefaultVegasMax
	}
	c.Max = max(c.Max, c.Min)
	if c.Initial <= 0 {
		c.Initial = DefaultVegasInitial
	}
	c.Initial = min(max(c.Initial, c.Min), c.Max)
	if c.Window <= 0 {
		c.Window = DefaultVegasWindow
	}
	return c
}

// Vegas is a concurrency limiter for push permits in the style of TCP Vegas;
// the package documentation describes how it adapts. It is safe for
// concurrent use, and one limiter is meant to be shared by every shard so
// that the bound is on the database, not on a shard.
type Vegas struct {
	inflight atomic.Int64
	limit    atomic.Int64
	waiting  atomic.Int64 // len(waiters), readable without mu

	mu      sync.Mutex
	cfg     VegasConfig
	cur     time.Duration // minimum of the current window, 0 if empty
	prev    time.Duration // minimum of the previous window, 0 if none
	samples int
	waiters []*Waiter // FIFO of refused Acquire callers
}

// Waiter is a caller of [Vegas.Acquire] that can be queued for a permit.
// Its fields are guarded by the limiter's mutex.
type Waiter struct {
	wake   func()
	queued bool
}

// NewWaiter returns a waiter whose wake is called, without waiting and
// possibly under the limiter's lock, when a permit may be free for it: wake
// must not block nor call back into the limiter.
func NewWaiter(wake func()) *Waiter { return &Waiter{wake: wake} }

// NewVegas returns a limiter whose limit starts at cfg.Initial.
func NewVegas(cfg VegasConfig) *Vegas {
	v := &Vegas{cfg: cfg.withDefaults()}
	v.limit.Store(int64(v.cfg.Initial))
	return v
}

// TryAcquire takes a permit if fewer than Limit are held, without waiting.
// Every granted permit must be given back with Release.
func (v *Vegas) TryAcquire() bool {
	for {
		n := v.inflight.Load()
		if n >= v.limit.Load() {
			return false
		}
		if v.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Acquire takes a permit for w, without waiting, if one is free and no
// other waiter is queued ahead of w. Otherwise it queues w (once) and returns
// false; w's wake is called when a permit is released while w is at the head
// of the queue, and w should then call Acquire again. A caller who no longer
// wants a permit must call Cancel.
//
// Queuing is what makes bundles fill up under load: a freed permit goes to
// the caller refused longest ago, which has been accumulating work since,
// rather than to whichever caller happens to try first, typically one that
// just received a single item.
func (v *Vegas) Acquire(w *Waiter) bool {
	if v.waiting.Load() == 0 && v.TryAcquire() {
		return true
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !w.queued {
		w.queued = true
		v.waiters = append(v.waiters, w)
		v.waiting.Add(1)
	}
	// Retried under mu, after queueing: a Release between the caller's
	// failed attempt and the queueing could not have woken w.
	if v.waiters[0] != w || !v.TryAcquire() {
		return false
	}
	v.dequeueHead()
	return true
}

// Cancel takes w out of the queue, if it is queued.
func (v *Vegas) Cancel(w *Waiter) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !w.queued {
		return
	}
	for i, o := range v.waiters {
		if o == w {
			if i == 0 {
				v.dequeueHead()
				return
			}
			v.waiters = append(v.waiters[:i], v.waiters[i+1:]...)
			break
		}
	}
	w.queued = false
	v.waiting.Add(-1)
}

// dequeueHead removes the head waiter and, if another permit is free, wakes
// the next one. Called with mu held.
func (v *Vegas) dequeueHead() {
	v.waiters[0].queued = false
	n := copy(v.waiters, v.waiters[1:])
	v.waiters[n] = nil
	v.waiters = v.waiters[:n]
	v.waiting.Add(-1)
	v.wakeHead()
}

// wakeHead wakes the head waiter if a permit is free. Called with mu held.
func (v *Vegas) wakeHead() {
	if len(v.waiters) > 0 && v.inflight.Load() < v.limit.Load() {
		v.waiters[0].wake()
	}
}

// Release gives back a permit and adapts the limit: rtt is how long the
// permit's round trip took and dropped reports that it failed or timed out,
// which halves the limit.
func (v *Vegas) Release(rtt time.Duration, dropped bool) {
	// Permits held before this release, which tells whether the lane was
	// actually using its limit.
	held := int(v.inflight.Add(-1)) + 1

	v.mu.Lock()
	defer v.mu.Unlock()
	limit := int(v.limit.Load())
	if dropped {
		limit /= 2
	} else {
		rtt = max(rtt, time.Nanosecond)
		base := v.observe(rtt)
		queue := float64(limit) * (1 - float64(base)/float64(rtt))
		switch {
		case queue < float64(v.cfg.Alpha) && 2*held >= limit:
			limit++
		case queue > float64(v.cfg.Beta):
			limit--
		}
	}
	v.limit.Store(int64(min(max(limit, v.cfg.Min), v.cfg.Max)))
	v.wakeHead()
}

// release gives back a permit without a sample: its round trip was cut
// short by the caller, not by the database.
func (v *Vegas) release() {
	v.inflight.Add(-1)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.wakeHead()
}

// observe records a sample and returns the no-load round trip estimate.
func (v *Vegas) observe(rtt time.Duration) time.Duration {
	if v.samples >= v.cfg.Window {
		v.prev, v.cur, v.samples = v.cur, 0, 0
	}
	v.samples++
	if v.cur == 0 || rtt < v.cur {
		v.cur = rtt
	}
	if v.prev != 0 && v.prev < v.cur {
		return v.prev
	}
	return v.cur
}

// Limit is the current number of permits.
func (v *Vegas) Limit() int { return int(v.limit.Load()) }
