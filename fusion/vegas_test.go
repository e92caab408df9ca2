package fusion

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// round takes every permit, then gives them all back with rtt.
func round(v *Vegas, rtt time.Duration) {
	n := 0
	for v.TryAcquire() {
		n++
	}
	for range n {
		v.Release(rtt, false)
	}
}

func TestVegasDefaults(t *testing.T) {
	v := NewVegas(VegasConfig{})
	if v.Limit() != 4 || v.cfg.Min != 1 || v.cfg.Max != 64 || v.cfg.Alpha != 2 || v.cfg.Beta != 4 {
		t.Fatalf("defaults %+v, limit %d", v.cfg, v.Limit())
	}
	v = NewVegas(VegasConfig{Initial: 100, Min: 8, Max: 4, Alpha: 5, Beta: 3})
	if v.Limit() != 8 || v.cfg.Max != 8 || v.cfg.Beta != 5 {
		t.Fatalf("inconsistent config not repaired: %+v, limit %d", v.cfg, v.Limit())
	}
}

func TestVegasGrowsAtBaseline(t *testing.T) {
	v := NewVegas(VegasConfig{Initial: 4, Max: 16})
	for range 50 {
		round(v, 10*time.Millisecond)
	}
	if v.Limit() != 16 {
		t.Fatalf("limit %d after rounds at the minimum rtt, want Max 16", v.Limit())
	}
}

func TestVegasIdleDoesNotGrow(t *testing.T) {
	v := NewVegas(VegasConfig{Initial: 8})
	for range 100 {
		if !v.TryAcquire() {
			t.Fatal("no permit")
		}
		v.Release(10*time.Millisecond, false)
	}
	if v.Limit() != 8 {
		t.Fatalf("limit %d grew while one permit of 8 was used", v.Limit())
	}
}

func TestVegasShrinksWhenRTTInflates(t *testing.T) {
	v := NewVegas(VegasConfig{Initial: 20, Max: 20})
	round(v, 10*time.Millisecond)
	if v.Limit() != 20 {
		t.Fatalf("limit %d", v.Limit())
	}
	for range 50 {
		round(v, 100*time.Millisecond)
	}
	// queue = limit × 0.9 settles between Alpha and Beta.
	if got := v.Limit(); got < 3 || got > 5 {
		t.Fatalf("limit %d after rtt inflated tenfold, want about Beta/0.9", got)
	}
}

func TestVegasBaselineFollowsChange(t *testing.T) {
	v := NewVegas(VegasConfig{Initial: 20, Max: 20, Window: 20})
	round(v, 10*time.Millisecond)
	for range 5 {
		round(v, 50*time.Millisecond)
	}
	low := v.Limit()
	if low >= 20 {
		t.Fatalf("limit %d did not shrink", low)
	}
	// Once the 10ms sample has aged out, 50ms is the new baseline.
	for range 60 {
		round(v, 50*time.Millisecond)
	}
	if v.Limit() != 20 {
		t.Fatalf("limit %d: the baseline did not follow the new rtt (was %d)", v.Limit(), low)
	}
}

func TestVegasHalvesOnDrop(t *testing.T) {
	v := NewVegas(VegasConfig{Initial: 32, Min: 3})
	for _, want := range []int{16, 8, 4, 3, 3} {
		if !v.TryAcquire() {
			t.Fatal("no permit")
		}
		v.Release(time.Second, true)
		if v.Limit() != want {
			t.Fatalf("limit %d after a drop, want %d", v.Limit(), want)
		}
	}
}

func TestVegasStaysInBounds(t *testing.T) {
	v := NewVegas(VegasConfig{Initial: 5, Min: 2, Max: 9, Window: 7})
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		held := 0
		for held < 1+r.IntN(12) && v.TryAcquire() {
			held++
		}
		for range held {
			v.Release(time.Duration(1+r.IntN(100))*time.Millisecond, r.IntN(20) == 0)
			if l := v.Limit(); l < 2 || l > 9 {
				t.Fatalf("limit %d out of [2, 9]", l)
			}
		}
	}
}

func TestVegasNeverOvergrants(t *testing.T) {
	const limit = 5
	v := fixedLimiter(limit)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for range 2000 {
				if !v.TryAcquire() {
					continue
				}
				n := held.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				held.Add(-1)
				v.Release(time.Millisecond, false)
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > limit || p == 0 {
		t.Fatalf("peak concurrent permits %d, limit %d", p, limit)
	}
}

// A freed permit goes to the caller refused first, not to whoever asks next,
// and the waiters are woken in turn.
func TestVegasAcquireQueuesInOrder(t *testing.T) {
	v := NewVegas(VegasConfig{Initial: 1, Max: 1})
	var woke []string
	a := NewWaiter(func() { woke = append(woke, "a") })
	b := NewWaiter(func() { woke = append(woke, "b") })
	c := NewWaiter(func() { woke = append(woke, "c") })
	if !v.Acquire(a) {
		t.Fatal("free permit refused")
	}
	if v.Acquire(b) || v.Acquire(c) {
		t.Fatal("permit granted beyond the limit")
	}
	v.Release(time.Millisecond, false)
	if len(woke) != 1 || woke[0] != "b" {
		t.Fatalf("woken %v after release, want [b]", woke)
	}
	// A newcomer and a waiter behind the head are refused the free permit.
	if v.Acquire(a) || v.Acquire(c) {
		t.Fatal("permit taken ahead of the head waiter")
	}
	if !v.Acquire(b) {
		t.Fatal("head waiter refused a free permit")
	}
	v.Release(time.Millisecond, false)
	if !v.Acquire(c) {
		t.Fatal("c, now head, refused")
	}
	// a queued again behind c; cancelling it leaves nothing to wake.
	v.Cancel(a)
	v.Release(time.Millisecond, false)
	if got := woke[len(woke)-1]; got != "c" || v.waiting.Load() != 0 {
		t.Fatalf("woken %v, %d still waiting", woke, v.waiting.Load())
	}
	if !v.Acquire(a) {
		t.Fatal("free permit refused with nobody waiting")
	}
}

// Cancelling the head waiter hands its turn to the next one.
func TestVegasCancelHeadWakesNext(t *testing.T) {
	v := NewVegas(VegasConfig{Initial: 1, Max: 1})
	var woke int
	a := NewWaiter(func() {})
	b := NewWaiter(func() {})
	c := NewWaiter(func() { woke++ })
	v.Acquire(a)
	v.Acquire(b)
	v.Acquire(c)
	v.Release(time.Millisecond, false)
	v.Cancel(b)
	if woke != 1 || !v.Acquire(c) {
		t.Fatalf("c woken %d times after b gave up its turn", woke)
	}
}
