//go:build unix

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/e03140bc/queen"
)

// queenDrain: Consume (batch 1000, explicit acks: each partition batch is
// settled in one round trip after its handlers) over the backlog left by
// the batch scenario. The clock runs from Consume's start until it has
// returned after the target count was handled, so the last acks are in.
func (b *bench) queenDrain(ctx context.Context) (*result, error) {
	target := min(int64(b.cfg.nDrain), b.queenBacklog)
	name := fmt.Sprintf("queen: Consume batch 1000, explicit acks, concurrency %d", b.cfg.concurrency)
	if b.cfg.popParts > 1 {
		name += fmt.Sprintf(", %d partitions per pop", b.cfg.popParts)
	}
	if b.cfg.batchParts != narrowParts {
		name += fmt.Sprintf(", backlog in %s partition%s", fmtInt(float64(b.cfg.batchParts)), plural(b.cfg.batchParts))
	}
	if target == 0 {
		return &result{Name: name, Queen: true, Unavailable: "no backlog to drain (run batch in the same invocation)"}, nil
	}
	q := b.client.Queue("batch")
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var handled, bytes atomic.Int64
	var capped atomic.Bool
	timer := time.AfterFunc(b.cfg.maxTime, func() { capped.Store(true); cancel() })
	defer timer.Stop()
	start := time.Now()
	err := q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 1000, Partitions: b.cfg.popParts}, Concurrency: b.cfg.concurrency},
		func(_ context.Context, m *queen.Message) error {
			bytes.Add(int64(len(m.Data)))
			if handled.Add(1) == target {
				cancel()
			}
			return nil
		})
	el := time.Since(start)
	timer.Stop()
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	done := min(handled.Load(), target)
	if !capped.Load() && done < target {
		return nil, fmt.Errorf("consume returned after %d of %d messages", done, target)
	}
	// The cursor sum shows what was acked for good.
	var acked int64
	ackNote := "acked count unknown"
	err = b.base.QueryRow(ctx, `SELECT coalesce(sum(c.committed + 1), 0) FROM bench_queen.consumers c
		JOIN bench_queen.partitions p ON p.id = c.partition_id JOIN bench_queen.queues q ON q.id = p.queue_id
		WHERE q.name = 'batch'`).Scan(&acked)
	if err == nil {
		ackNote = fmt.Sprintf("%d messages acked (sum of cursors) when Consume returned", acked)
	}
	return &result{
		Name: name, Queen: true, Msgs: done, Target: target, Seconds: el.Seconds(), Capped: capped.Load(),
		Note: ackNote,
	}, nil
}

// e2eCase is one row of the end-to-end matrix: an offered rate and how
// queen consumes it (River takes the same rate with its own settings).
type e2eCase struct {
	rate, parts, concurrency, batch int
}

// parseE2E reads -e2e: comma-separated rate:partitions:concurrency:batch.
func parseE2E(s string) ([]e2eCase, error) {
	var out []e2eCase
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		var c e2eCase
		if _, err := fmt.Sscanf(f, "%d:%d:%d:%d", &c.rate, &c.parts, &c.concurrency, &c.batch); err != nil {
			return nil, fmt.Errorf("-e2e: %q is not rate:partitions:concurrency:batch", f)
		}
		if c.rate <= 0 || c.parts <= 0 || c.concurrency <= 0 || c.batch <= 0 {
			return nil, fmt.Errorf("-e2e: %q: every field must be positive", f)
		}
		out = append(out, c)
	}
	return out, nil
}

// e2eRecorder collects, per message (by its sequence number in the
// schedule), the latency from its scheduled send time to the start of its
// handler. A redelivered message counts once, at its first start.
type e2eRecorder struct {
	total   int64
	lat     []int64 // ns; 0: not handled yet
	start   []int64 // handler start, Unix ns
	called  []int64 // when the send call started, Unix ns
	sent    []int64 // when the send call returned, Unix ns
	handled atomic.Int64
	allIn   chan struct{}
}

func newE2ERecorder(total int64) *e2eRecorder {
	return &e2eRecorder{total: total, lat: make([]int64, total), start: make([]int64, total), called: make([]int64, total), sent: make([]int64, total), allIn: make(chan struct{})}
}

// record is called at the start of a handler (worker).
func (r *e2eRecorder) record(seq, sched int64) {
	now := time.Now().UnixNano()
	if seq < 0 || seq >= r.total || !atomic.CompareAndSwapInt64(&r.lat[seq], 0, max(now-sched, 1)) {
		return
	}
	r.start[seq] = now
	if r.handled.Add(1) == r.total {
		close(r.allIn)
	}
}

// openLoop offers total sends at a fixed rate (open loop) from a pool of 500
// goroutines: send gets each message's sequence number and scheduled time
// (Unix ns), so a late send counts against the latency. Sends not started
// by e2eGrace after the last scheduled time are dropped (they count as
// never handled): a side whose sends cannot keep up does not stretch the
// scenario without end. It returns when every send has returned, with the
// sorted durations of the send calls.
//
// The senders take turns at the clock: the one holding it takes the next
// sequence number, sleeps until that send's time, passes the clock on and
// makes the send itself. No goroutine hand-off lies between a send's time
// and its call (a hand-off from a pacing goroutine to a parked sender woke
// a second thread, on a VM often a halted vCPU: 0.1–0.2 ms counted against
// every side's latency at 100 msgs/s); the next sender wakes while this
// one's call runs.
func openLoop(ctx context.Context, rate int, rec *e2eRecorder, start time.Time, send func(seq, sched int64) error) ([]time.Duration, error) {
	const pushers = 500
	var sendErr atomic.Value
	var wg sync.WaitGroup
	total := rec.total
	callLat := newLatencies(pushers, int(total/pushers)+1)
	interval := time.Second / time.Duration(rate)
	cutoff := start.Add(time.Duration(total-1)*interval + e2eGrace)
	var (
		clock sync.Mutex
		next  int64 // guarded by clock
		pace  = newPacer()
	)
	defer pace.close()
	for g := range pushers {
		wg.Go(func() {
			for {
				clock.Lock()
				seq := next
				if seq >= total || ctx.Err() != nil {
					clock.Unlock()
					return
				}
				next++
				sched := start.Add(time.Duration(seq) * interval)
				pace.sleepUntil(sched) // guarded by clock
				clock.Unlock()
				if time.Now().After(cutoff) {
					continue
				}
				t := time.Now()
				rec.called[seq] = t.UnixNano()
				if err := send(seq, sched.UnixNano()); err != nil {
					sendErr.CompareAndSwap(nil, err)
				}
				now := time.Now()
				rec.sent[seq] = now.UnixNano()
				callLat.add(g, now.Sub(t))
			}
		})
	}
	wg.Wait()
	if err, _ := sendErr.Load().(error); err != nil {
		return nil, err
	}
	return callLat.sorted(), ctx.Err()
}

// e2eGrace is how long a scenario waits, after the last scheduled send, for
// the rest to be handled; a scenario that needs more is marked capped.
const e2eGrace = 10 * time.Second

// e2eKeptUpLag: a side kept up when every message was handled and the last
// handler started within this long after the last scheduled send.
const e2eKeptUpLag = time.Second

// runE2E drives one end-to-end scenario: it starts the consumer side
// (started returns a stop function), waits for it to settle, offers the
// load with send, waits for the messages (up to e2eGrace after the offer
// window) and builds the row.
func runE2E(ctx context.Context, name string, c e2eCase, rec *e2eRecorder,
	startConsumer func() (stop func() error, err error), send func(seq, sched int64) error) (*result, error) {
	stop, err := startConsumer()
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()
	time.Sleep(500 * time.Millisecond) // let the consumer park in its long-poll / LISTEN

	start := time.Now()
	callLat, err := openLoop(ctx, c.rate, rec, start, send)
	if err != nil {
		return nil, err
	}
	// The last message's scheduled send time.
	offerEnd := start.Add(time.Duration(rec.total-1) * (time.Second / time.Duration(c.rate)))
	capped := false
	select {
	case <-rec.allIn:
	case <-time.After(time.Until(offerEnd.Add(e2eGrace))):
		capped = true
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	end := time.Now()
	var last int64
	for i, d := range rec.lat {
		if d > 0 {
			last = max(last, start.UnixNano()+int64(i)*int64(time.Second/time.Duration(c.rate))+d)
		}
	}
	stopped = true
	if err := stop(); err != nil {
		return nil, err
	}
	got := rec.handled.Load()
	// A message never handled counts with the time it had waited when the
	// scenario ended: a lower bound, so a side that fell behind is not
	// flattered by leaving out its slowest messages.
	l := make([]time.Duration, rec.total)
	interval := time.Second / time.Duration(c.rate)
	for i, d := range rec.lat {
		if d == 0 {
			d = int64(end.Sub(start.Add(time.Duration(i) * interval)))
		}
		l[i] = time.Duration(d)
	}
	slices.Sort(l)
	// The consumer's share: from the send call's return (the message is
	// committed) to its handler's start. Negative when the handler started
	// before the sender got the answer.
	var side, fromCall []time.Duration
	for i, st := range rec.start {
		if st != 0 && rec.sent[i] != 0 {
			side = append(side, time.Duration(st-rec.sent[i]))
			fromCall = append(fromCall, time.Duration(st-rec.called[i]))
		}
	}
	slices.Sort(side)
	slices.Sort(fromCall)
	lag := time.Duration(last - offerEnd.UnixNano())
	if capped {
		lag = end.Sub(offerEnd)
	}
	kept := got == rec.total && lag <= e2eKeptUpLag
	keptS := "kept up"
	if !kept {
		keptS = fmt.Sprintf("FELL BEHIND (%s of %s handled)", fmtInt(float64(got)), fmtInt(float64(rec.total)))
	}
	return &result{
		Name: name, Msgs: got, Target: rec.total, Seconds: time.Duration(max(last-start.UnixNano(), 1)).Seconds(), Capped: capped,
		Offered: float64(c.rate), LatencyOf: "scheduled send to handler start", P50ms: ms(pct(l, 50)), P99ms: ms(pct(l, 99)),
		KeptUp: &kept, LagMs: ms(lag),
		Note: fmt.Sprintf("%s: last handler start %s after the last scheduled send; p99.9 %s, max %s; the send calls alone: p50 %s, p99 %s; "+
			"send returned → handler start: p50 %s, p99 %s; send called → handler start: p50 %s, p99 %s", keptS,
			fmtMs(ms(lag)), fmtMs(ms(pct(l, 99.9))), fmtMs(ms(pct(l, 100))), fmtMs(ms(pct(callLat, 50))), fmtMs(ms(pct(callLat, 99))),
			fmtMsSigned(ms(pct(side, 50))), fmtMsSigned(ms(pct(side, 99))), fmtMs(ms(pct(fromCall, 50))), fmtMs(ms(pct(fromCall, 99)))),
	}, nil
}

// e2eData is a queen message of the end-to-end scenarios: the schedule's
// sequence number and the scheduled send time ahead of the usual payload.
func (b *bench) e2eData(seq, sched int64) []byte {
	data := make([]byte, payloadSize)
	copy(data, b.payloads[seq%int64(len(b.payloads))])
	binary.LittleEndian.PutUint64(data, uint64(seq))
	binary.LittleEndian.PutUint64(data[8:], uint64(sched))
	return data
}

// queenE2E: single-item pushes at a fixed offered rate over c.parts
// partitions while Consume (c.concurrency, c.batch) handles them; latency is
// scheduled push to handler start.
func (b *bench) queenE2E(c e2eCase) func(context.Context) (*result, error) {
	return func(ctx context.Context) (*result, error) {
		total := int64(float64(c.rate) * b.cfg.e2eDur.Seconds())
		name := fmt.Sprintf("queen: end to end at %s msgs/s, %d partition%s, Concurrency %d, Batch %d",
			fmtInt(float64(c.rate)), c.parts, plural(c.parts), c.concurrency, c.batch)
		if total <= 0 {
			return &result{Name: name, Queen: true, Unavailable: "-e2e-time is zero"}, nil
		}
		q := b.client.Queue(fmt.Sprintf("e2e-%d", c.rate))
		parts := partNames(c.parts)
		rec := newE2ERecorder(total)
		r, err := runE2E(ctx, name, c, rec, func() (func() error, error) {
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: c.batch}, Concurrency: c.concurrency},
					func(_ context.Context, m *queen.Message) error {
						if len(m.Data) < 16 {
							return errors.New("short payload")
						}
						rec.record(int64(binary.LittleEndian.Uint64(m.Data)), int64(binary.LittleEndian.Uint64(m.Data[8:])))
						return nil
					})
			}()
			return func() error { cancel(); return <-done }, nil
		}, func(seq, sched int64) error {
			return checkPush(q.Push(ctx, []queen.Item{{Data: b.e2eData(seq, sched), Partition: parts[seq%int64(c.parts)]}}))
		})
		if r != nil {
			r.Queen = true
		}
		return r, err
	}
}

func fmtMsSigned(v float64) string {
	if v < 0 {
		return "-" + fmtMs(-v)
	}
	return fmtMs(v)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
