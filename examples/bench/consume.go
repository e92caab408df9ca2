//go:build unix

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
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

// endToEnd: single-item pushes at a fixed offered rate (open loop: each
// message carries its scheduled send time, so a late push counts against
// the latency) while Consume handles them; latency is scheduled push to
// handler.
func (b *bench) endToEnd(ctx context.Context) (*result, error) {
	rate := b.cfg.e2eRate
	total := int64(float64(rate) * b.cfg.e2eDur.Seconds())
	name := fmt.Sprintf("queen: end to end, push → Consume handler at %s msgs/s offered", fmtInt(float64(rate)))
	if total <= 0 {
		return &result{Name: name, Queen: true, Unavailable: "-rate or -e2e-time is zero"}, nil
	}
	q := b.client.Queue("e2e")
	parts := partNames(narrowParts)
	lat := make([]time.Duration, total)
	var handled atomic.Int64
	allIn := make(chan struct{})
	var once sync.Once
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	consumeErr := make(chan error, 1)
	go func() {
		consumeErr <- q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 1000, Partitions: b.cfg.popParts}, Concurrency: b.cfg.concurrency},
			func(_ context.Context, m *queen.Message) error {
				now := time.Now().UnixNano()
				if len(m.Data) < 8 {
					return errors.New("short payload")
				}
				sched := int64(binary.LittleEndian.Uint64(m.Data))
				if i := handled.Add(1) - 1; i < total {
					lat[i] = time.Duration(now - sched)
					if i == total-1 {
						once.Do(func() { close(allIn) })
					}
				}
				return nil
			})
	}()
	time.Sleep(200 * time.Millisecond) // let the consumers park in their long-poll

	// Producers: a bounded pool takes scheduled send times from a queue.
	const pushers = 500
	sends := make(chan int64, rate)
	var pushErr atomic.Value
	var wg sync.WaitGroup
	var seq atomic.Int64
	pushLat := newLatencies(pushers, int(total/pushers)+1)
	for g := range pushers {
		wg.Go(func() {
			for sched := range sends {
				t := time.Now()
				i := seq.Add(1) - 1
				data := make([]byte, payloadSize)
				copy(data, b.payloads[i%int64(len(b.payloads))])
				binary.LittleEndian.PutUint64(data, uint64(sched))
				if err := checkPush(q.Push(ctx, []queen.Item{{Data: data, Partition: parts[i%narrowParts]}})); err != nil {
					pushErr.CompareAndSwap(nil, err)
				}
				pushLat.add(g, time.Since(t))
			}
		})
	}
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for sent := int64(0); sent < total && ctx.Err() == nil; {
		due := min(total, int64(time.Since(start)/interval)+1)
		for ; sent < due; sent++ {
			sends <- start.Add(time.Duration(sent) * interval).UnixNano()
		}
		time.Sleep(time.Millisecond)
	}
	close(sends)
	wg.Wait()
	if err, _ := pushErr.Load().(error); err != nil {
		return nil, err
	}
	capped := false
	select {
	case <-allIn:
	case <-time.After(10 * time.Second):
		capped = true
	case <-ctx.Done():
	}
	el := time.Since(start)
	cancel()
	if err := <-consumeErr; err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	got := min(handled.Load(), total)
	pl := pushLat.sorted()
	l := slices.Clone(lat[:got])
	slices.Sort(l)
	return &result{
		Name: name, Queen: true, Msgs: got, Target: total, Seconds: el.Seconds(), Capped: capped, Offered: float64(rate),
		LatencyOf: "scheduled push to handler", P50ms: ms(pct(l, 50)), P99ms: ms(pct(l, 99)),
		Note: fmt.Sprintf("p99.9 %s, max %s; the push calls alone: p50 %s, p99 %s", fmtMs(ms(pct(l, 99.9))), fmtMs(ms(pct(l, 100))),
			fmtMs(ms(pct(pl, 50))), fmtMs(ms(pct(pl, 99)))),
	}, nil
}
