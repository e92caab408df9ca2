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
	// Defaults to 2.
	Alpha int
	// Beta is the estimated queue above which the limit shrinks by one.
	// Defaults to 4.
	Beta int
	// Initial is the starting limit. Defaults to 4.
	Initial int
	// Max is the largest limit. Defaults to 64.
	Max int
	// Min is the smallest limit. Defaults to 1.
	Min int
	// Window is the number of samples after which the no-load round trip
	// estimate starts forgetting older samples: the baseline is the minimum
	// over the current and the previous window. Defaults to 1000.
	Window int
}

func (c VegasConfig) withDefaults() VegasConfig {
	if c.Alpha <= 0 {
		c.Alpha = 2
	}
	if c.Beta <= 0 {
		c.Beta = 4
	}
	c.Beta = max(c.Beta, c.Alpha)
	if c.Min <= 0 {
		c.Min = 1
	}
	if c.Max <= 0 {
		c.Max = 64
	}
	c.Max = max(c.Max, c.Min)
	if c.Initial <= 0 {
		c.Initial = 4
	}
	c.Initial = min(max(c.Initial, c.Min), c.Max)
	if c.Window <= 0 {
		c.Window = 1000
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

	mu      sync.Mutex
	cfg     VegasConfig
	cur     time.Duration // minimum of the current window, 0 if empty
	prev    time.Duration // minimum of the previous window, 0 if none
	samples int
}

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
