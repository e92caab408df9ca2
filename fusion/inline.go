package fusion

import (
	"context"
	"time"
)

// inlineFlight is a flush run on the submitter's goroutine: one key, one
// submission.
type inlineFlight[K Keyer, T comparable] struct {
	ks     keyState[K, T]
	bundle [1]*Batch[K, T]
}

// inline flushes items on the caller's goroutine if key's shard is idle
// (nothing pending, nothing in flight, nothing on its way to it), no other
// inline flush of the shard runs, nobody queues at the limiter and a permit
// is free. It reports false, having done nothing, when the submission must
// take the shard's path instead.
//
// The shard goroutine is not involved unless it has to be: if arrivals
// reached it during the flush (it then holds their key flying) or the flush
// put items in Retry, the flight is handed to it on inlineDone, as a
// completion; otherwise nothing is sent.
func (e *Engine[K, T]) inline(ctx context.Context, key K, items []T, done func()) (bool, error) {
	if len(items) == 0 || ctx.Err() != nil {
		return false, nil
	}
	s := e.shards[key.Hash()%uint64(len(e.shards))]
	if s.ibusy.Load() || s.transit.Load() != 0 {
		return false, nil // busy: no lock taken
	}
	var n int64
	if e.sized {
		for _, it := range items {
			n += int64(any(it).(Sizer).Bytes())
		}
		if !e.bytes.tryAcquire(n) {
			return false, nil // Submit waits for room
		}
	}
	lim := e.cfg.Limiter
	s.imu.Lock()
	// Limiter.Acquire's fast path: a shard queued for a permit goes first.
	if s.ibusy.Load() || s.transit.Load() != 0 || s.inline != nil || e.stopping.Load() ||
		lim.waiting.Load() != 0 || !lim.TryAcquire() {
		s.imu.Unlock()
		e.bytes.release(n)
		return false, nil
	}
	in := s.spare
	s.spare = nil
	if in == nil {
		in = new(inlineFlight[K, T])
		in.bundle[0] = &in.ks.batch
	}
	in.ks.key, in.ks.batch.Key = key, key
	s.inline = in
	e.flights.Add(1) // Close waits for it like for any flight
	s.imu.Unlock()
	defer e.flights.Done()

	sub := newSubmission(done, len(items))
	sub.bytes, sub.budget = n, &e.bytes
	in.ks.batch.Items = items
	in.ks.flightRuns = append(in.ks.flightRuns[:0], run{sub: sub, n: len(items)})

	fctx, cancel := e.cfg.FlushContext()
	start := time.Now()
	err := e.flush(fctx, in.bundle[:])
	rtt := time.Since(start)
	cancel()
	lim.Release(rtt, err != nil)
	retried := len(in.ks.batch.Retry)
	s.tally(1, len(items), retried, err != nil)
	s.inlined.Add(1)
	in.ks.settle()

	s.imu.Lock()
	defer s.imu.Unlock()
	s.inline = nil
	if s.iwant || retried > 0 {
		// The shard takes the key back; until it has, no inline flush
		// starts on it.
		s.iwant = false
		s.ibusy.Store(true)
		s.inlineDone <- in
		return true, nil
	}
	clear(in.ks.flightRuns)
	in.ks.flightRuns = in.ks.flightRuns[:0]
	in.ks.batch.Items, in.ks.batch.Retry = nil, nil
	s.spare = in
	return true, nil
}
