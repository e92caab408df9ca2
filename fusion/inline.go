package fusion

import (
	"context"
	"errors"
	"time"
)

// ErrCallerGone is the cause (context.Cause) of an inline flush's context
// when the submitter's own context ended during it. The flush is abandoned
// as an INSERT is: its outcome is unknown to the caller, who gets
// ctx.Err(); a FlushFunc should resolve the items as failed and must not
// take the cancellation for a database failure.
var ErrCallerGone = errors.New("fusion: the submitter's context ended during its inline flush")

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
	h := key.Hash()
	s := e.shards[h%uint64(len(e.shards))]
	if s.ibusy.Load() || s.transit.Load() != 0 {
		return false, nil // busy: no lock taken
	}
	var n int64
	if e.sized {
		for _, it := range items {
			n += int64(any(it).(Sizer).Bytes())
		}
		if n > 0 && !e.bytes.tryAcquire(n) {
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
	in.ks.key, in.ks.batch.Key, in.ks.hash, in.ks.batch.Hash = key, key, h, h
	s.inline = in
	e.flights.Add(1) // Close waits for it like for any flight
	s.imu.Unlock()
	defer e.flights.Done()

	sub := newSubmission(done, len(items))
	sub.bytes, sub.budget = n, &e.bytes
	in.ks.batch.Items = items
	in.ks.flightRuns = append(in.ks.flightRuns[:0], run{sub: sub, n: len(items)})

	// The flush has the engine's context and timeout, and ends with the
	// caller's: it carries nothing of anyone else's, and the caller cannot
	// stop waiting while running it.
	fctx, cancel := e.cfg.FlushContext()
	gone := false
	var err error
	start := time.Now()
	if ctx.Done() == nil { // a caller that cannot give up
		err = e.flush(fctx, in.bundle[:])
	} else {
		cctx, abort := context.WithCancelCause(fctx)
		stop := context.AfterFunc(ctx, func() { abort(ErrCallerGone) })
		err = e.flush(cctx, in.bundle[:])
		gone = !stop()
		abort(nil)
	}
	rtt := time.Since(start)
	cancel()
	if gone {
		lim.release() // a cut round trip says nothing of the database
	} else {
		lim.Release(rtt, err != nil)
	}
	retried := len(in.ks.batch.Retry)
	s.tally(1, len(items), retried, err != nil && !gone)
	s.inlined.Add(1)
	in.ks.settle()

	var res error
	if gone {
		res = ctx.Err()
	}
	s.imu.Lock()
	defer s.imu.Unlock()
	s.inline = nil
	if s.iwant || retried > 0 {
		// The shard takes the key back; until it has, no inline flush
		// starts on it.
		s.iwant = false
		s.ibusy.Store(true)
		s.inlineDone <- in
		return true, res
	}
	clear(in.ks.flightRuns)
	in.ks.flightRuns = in.ks.flightRuns[:0]
	in.ks.batch.Items, in.ks.batch.Retry = nil, nil
	s.spare = in
	return true, res
}
