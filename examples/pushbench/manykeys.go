package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/e03140bc/queen"
)

// manyKeys runs the same load (single-item pushes from 1000 goroutines, a
// uniformly random key each) over 100 keys and over -keys keys, and reports
// the ratio. The wide queue's keys are created first (one message each, the
// "first touch" line), so the measured phase compares steady states.
func manyKeys(ctx context.Context, client *queen.Client, payload []byte) error {
	run := func(name string, q *queen.Queue, n int) (float64, error) {
		before := client.Stats()
		rate, lat, err := load(1000, func(_, _ int) error {
			_, err := q.Push(ctx, []queen.Item{{Data: payload, Partition: keyName(rand.IntN(n))}})
			return err
		}, 1)
		if err != nil {
			return 0, err
		}
		report(name, rate, lat)
		printStats(before, client.Stats())
		return rate, nil
	}
	narrow, err := run("manykeys: 1000 goroutines, 100 keys", client.Queue("mk-narrow"), 100)
	if err != nil {
		return err
	}
	wide := client.Queue("mk-wide")
	// First touch: every key created by its first push, 1000 goroutines
	// each taking the next uncreated key.
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	lats := make([][]time.Duration, 1000)
	start := time.Now()
	for g := range 1000 {
		wg.Go(func() {
			for {
				k := int(next.Add(1)) - 1
				if k >= *keys {
					return
				}
				t := time.Now()
				if _, err := wide.Push(ctx, []queen.Item{{Data: payload, Partition: keyName(k)}}); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				lats[g] = append(lats[g], time.Since(t))
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	report(fmt.Sprintf("manykeys: first touch of %d keys", *keys), float64(*keys)/time.Since(start).Seconds(), all)
	wideRate, err := run(fmt.Sprintf("manykeys: 1000 goroutines, %d keys", *keys), wide, *keys)
	if err != nil {
		return err
	}
	fmt.Printf("  %d keys / 100 keys = %.2f\n", *keys, wideRate/narrow)
	return nil
}

func keyName(i int) string { return fmt.Sprintf("key-%06d", i) }

// popReady measures Pop when a queue has -keys partitions of which only a
// few have messages: the claim must find them without walking the rest.
func popReady(ctx context.Context, client *queen.Client, payload []byte) error {
	q := client.Queue("popready")
	t0 := time.Now()
	// One message per key, pushed 1000 keys per call from 8 goroutines.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			items := make([]queen.Item, 0, 1000)
			for k := g * 1000; k < *keys; k += 8 * 1000 {
				items = items[:0]
				for j := k; j < min(k+1000, *keys); j++ {
					items = append(items, queen.Item{Data: payload, Partition: keyName(j)})
				}
				if _, err := q.Push(ctx, items); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Printf("  popready: %d keys created in %s\n", *keys, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	drained := 0
	for {
		msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 1000, Partitions: 1000, AutoAck: true})
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			break
		}
		drained += len(msgs)
	}
	fmt.Printf("  popready: drained %d messages (auto-ack, 1000 partitions per pop) in %s\n", drained, time.Since(t0).Round(time.Millisecond))

	// Few ready: 10 random keys with 100 messages each.
	for range 10 {
		k := keyName(rand.IntN(*keys))
		items := make([]queen.Item, 100)
		for i := range items {
			items[i] = queen.Item{Data: payload, Partition: k}
		}
		if _, err := q.Push(ctx, items); err != nil {
			return err
		}
	}
	var lat []time.Duration
	for range *popN {
		t := time.Now()
		msgs, err := q.Pop(ctx, queen.PopOptions{})
		if err != nil {
			return err
		}
		lat = append(lat, time.Since(t))
		if len(msgs) != 1 {
			return fmt.Errorf("popready: pop returned %d messages, want 1", len(msgs))
		}
		if err := msgs[0].Ack(ctx); err != nil {
			return err
		}
	}
	report(fmt.Sprintf("popready: pop+lease, %d parts, 10 ready", *keys), float64(len(lat))/sum(lat).Seconds(), lat)
	// Empty: drain the rest, then pop with nothing ready.
	for {
		msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 1000, Partitions: 10, AutoAck: true})
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			break
		}
	}
	lat = lat[:0]
	for range *popN {
		t := time.Now()
		msgs, err := q.Pop(ctx, queen.PopOptions{})
		if err != nil {
			return err
		}
		lat = append(lat, time.Since(t))
		if len(msgs) != 0 {
			return fmt.Errorf("popready: empty pop returned %d messages", len(msgs))
		}
	}
	report(fmt.Sprintf("popready: empty pop, %d parts, 0 ready", *keys), float64(len(lat))/sum(lat).Seconds(), lat)
	return nil
}

// keyedLanes runs single-item pushes from 1000 goroutines with Item.Key (no
// Partition: the queue's lanes) over 100, 100,000 and 1,000,000 keys, a
// uniformly random key each, and reports each against 100 keys. Keys do
// not create partitions, so there is no first touch to separate out.
func keyedLanes(ctx context.Context, client *queen.Client, payload []byte) error {
	var narrow float64
	for i, n := range []int{100, 100_000, 1_000_000} {
		q := client.Queue(fmt.Sprintf("keyed-%d", n))
		before := client.Stats()
		rate, lat, err := load(1000, func(_, _ int) error {
			_, err := q.Push(ctx, []queen.Item{{Data: payload, Key: keyName(rand.IntN(n))}})
			return err
		}, 1)
		if err != nil {
			return err
		}
		report(fmt.Sprintf("keyed: 1000 goroutines, Key over %d keys", n), rate, lat)
		printStats(before, client.Stats())
		if i == 0 {
			narrow = rate
		} else {
			fmt.Printf("  %d keys / 100 keys = %.2f\n", n, rate/narrow)
		}
	}
	return nil
}
