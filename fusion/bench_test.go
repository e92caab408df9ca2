package fusion

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// BenchmarkSubmit measures single-item submissions from 1000 goroutines over
// 100 keys against a flush that costs nothing, i.e. the engine's own cost.
// open: submitters do not wait for done (bounded only by backpressure).
// closed: each submitter waits for its done, like a push handler.
func BenchmarkSubmit(b *testing.B) {
	const (
		submitters = 1000
		nkeys      = 100
	)
	keys := make([]Key, nkeys)
	for i := range keys {
		keys[i] = keyN(i)
	}
	flush := func(context.Context, []*Batch[Key, *item]) error { return nil }

	for _, mode := range []string{"open", "closed"} {
		b.Run(mode, func(b *testing.B) {
			e := New(Config{}, flush)
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for g := range submitters {
				n := b.N / submitters
				if g < b.N%submitters {
					n++
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					its := []*item{{src: g}}
					ctx := context.Background()
					var pending sync.WaitGroup
					done := pending.Done
					if mode == "closed" {
						signal := make(chan struct{}, 1)
						done = func() { signal <- struct{}{} }
						for i := range n {
							if err := e.Submit(ctx, keys[(g+i)%nkeys], its, done); err != nil {
								b.Error(err)
								return
							}
							<-signal
						}
						return
					}
					pending.Add(n)
					for i := range n {
						if err := e.Submit(ctx, keys[(g+i)%nkeys], its, done); err != nil {
							b.Error(err)
							return
						}
					}
					pending.Wait()
				}()
			}
			wg.Wait()
			b.StopTimer()
			st := e.Stats()
			if err := e.Close(context.Background(), nil); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
			if st.Bundles > 0 {
				b.ReportMetric(float64(st.Segments)/float64(st.Bundles), "segments/bundle")
				b.ReportMetric(float64(st.Items)/float64(st.Segments), "items/segment")
			}
		})
	}
}

// BenchmarkSubmitWaitIdle measures one submitter waiting for each of its
// single-item submissions, against a flush that costs nothing: the
// engine's cost of an isolated submission, hand-offs included (inline=false)
// or not (inline=true).
func BenchmarkSubmitWaitIdle(b *testing.B) {
	flush := func(context.Context, []*Batch[Key, *item]) error { return nil }
	for _, inline := range []bool{false, true} {
		b.Run(map[bool]string{false: "inline=false", true: "inline=true"}[inline], func(b *testing.B) {
			e := New(Config{Inline: inline}, flush)
			its := []*item{{}}
			k := keyN(0)
			ctx := context.Background()
			seq := func(yield func(Key, []*item) bool) { yield(k, its) }
			b.ReportAllocs()
			for b.Loop() {
				if err := e.SubmitWait(ctx, 1, seq); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := e.Close(context.Background(), nil); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkSubmitWaitManyKeys is the push path of a load that spreads each
// call over many partitions (queen's lifecycle load): 8 submitters each wait
// for calls of 1000 single-item groups, every group another key of 100,000,
// against a flush that costs nothing. Keys come and go with every flush, so
// it measures the engine's per-key work: finding, adding and forgetting a
// key's state. One op is one item.
func BenchmarkSubmitWaitManyKeys(b *testing.B) {
	const (
		submitters = 8
		perCall    = 1000
		nkeys      = 100_000
	)
	keys := make([]Key, nkeys)
	for i := range keys {
		keys[i] = Key{Tenant: tenant, Queue: "lifecycle", Partition: fmt.Sprintf("key-%06d", i)}
	}
	flush := func(context.Context, []*Batch[Key, *item]) error { return nil }
	e := New(Config{BundleMax: 256, Inline: true}, flush)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, cpuOK := cpuTime()
	var wg sync.WaitGroup
	for g := range submitters {
		n := b.N / submitters
		if g < b.N%submitters {
			n++
		}
		wg.Go(func() {
			ctx := context.Background()
			its := make([]*item, perCall)
			for i := range its {
				its[i] = &item{src: g}
			}
			next := g
			for done := 0; done < n; {
				m := min(perCall, n-done)
				seq := func(yield func(Key, []*item) bool) {
					for i := range m {
						if !yield(keys[next], its[i:i+1]) {
							return
						}
						next = (next + submitters) % nkeys
					}
				}
				if err := e.SubmitWait(ctx, m, seq); err != nil {
					b.Error(err)
					return
				}
				done += m
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if cpu1, ok := cpuTime(); ok && cpuOK {
		// CPU time, which a busy machine blurs less than wall time.
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
	}
	st := e.Stats()
	if err := e.Close(context.Background(), nil); err != nil {
		b.Fatal(err)
	}
	if st.Bundles > 0 {
		b.ReportMetric(float64(st.Segments)/float64(st.Bundles), "segments/bundle")
	}
}
