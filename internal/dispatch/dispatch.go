// Package dispatch runs one Consume call's fetch loop: it claims batches
// for its workers, hands each partition's batch to one worker at a time,
// and claims again as soon as a worker frees up or a wake arrives. It knows
// nothing of SQL or of queen's messages: claiming, handling and settling are
// functions the caller passes in, and a batch is any type.
package dispatch

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/e03140bc/queen/internal/backoff"
)

// Config is one fetch loop. Every function field is required.
type Config[B any] struct {
	// Workers is how many batches are handled at once, and Hold how many
	// are in hand at most (running or queued behind a running one of their
	// partition, their leases running), at least Workers.
	Workers, Hold int
	// Claim claims at most n batches, each of its own partition; hints
	// are partitions a wake named since the last claim. It must return
	// every batch it claimed, even with an error.
	Claim func(ctx context.Context, hints []string, n int) ([]B, error)
	// Handle runs a batch's handlers and returns what settles it (nil:
	// nothing to settle). The settle runs after the worker's slot is freed:
	// it holds only the partition. alone reports, whenever asked, whether
	// no more partitions are in hand than there are workers: nothing else
	// waits for this worker, so it may keep its partition for the next
	// batch (Next).
	Handle func(b B, alone func() bool) (settle func())
	// Next, if set, is asked once a batch is settled for the batch of its
	// partition to run after it on the same worker, ahead of any queued
	// behind it (one claimed ahead under the same lease); false: none.
	Next func(B) (B, bool)
	// Keeps, if set, is asked once a batch's handlers are done: true when
	// its worker is likely to go on with Next. The slot it frees then
	// starts a claim only if the loop has one pending (a wake, a rescan):
	// a claim for it alone would find nothing, the partition being kept.
	Keeps func(B) bool
	// Partition is the partition a batch belongs to.
	Partition func(B) int64
	// Wake is a wake subscription: C fires when something was pushed,
	// Hints are the partitions named since the last call.
	Wake interface {
		C() <-chan struct{}
		TakeHints() []string
	}
	// Lingers, if set, reports whether every partition a wake names
	// (hints, never empty) is kept by a worker that takes what is pushed
	// to it by itself: such a wake starts no claim.
	Lingers func(hints []string) bool
	// Rescan is how often the loop claims without a wake.
	Rescan time.Duration
	// Failed is told of a failed claim. A non-nil return ends the loop
	// with that error (retrying cannot help); nil retries after a backoff
	// (Backoff, the next backoff).
	Failed func(err error, backoff time.Duration) error
	// Serial runs one claim at a time. Required when two claims can take
	// consecutive batches of one partition (batches that hold no lease):
	// claims in flight return in any order, and the later batch must not
	// be handed first.
	Serial bool
}

// BackoffMin and BackoffMax bound the wait after a failed claim: it doubles
// from BackoffMin per failure and is jittered.
const (
	BackoffMin = 50 * time.Millisecond
	BackoffMax = 5 * time.Second
)

// maxInFlight is how many claims run at once (unless Config.Serial): each
// reserves the workers it asked for, so the slots freed while one is in
// flight can start a second, and a round trip in flight does not leave the
// workers that finished during it idle until it returns (with fast
// handlers, about half of them).
const maxInFlight = 2

// Run runs the loop until stop ends or Failed returns an error, and returns
// once every batch in hand has been handled and settled (a worker hands
// back what stop keeps it from starting, through Handle).
//
// A claim that found fewer batches than it asked for waits for the next
// wake, freed worker or rescan tick: it never spins. A partition is handled
// by one worker at a time, in order: the lease guarantees it across
// consumers, and a local queue behind the running batch guarantees it for a
// partition claimed again here while still in hand (after its lease was
// lost, or with AutoAck, which holds no lease).
//
// A claim made with nothing in hand and no other claim in flight runs on
// the caller's goroutine; any other runs on its own, beside the loop.
func Run[B any](stop context.Context, cfg Config[B]) error {
	n, hold := cfg.Workers, max(cfg.Hold, cfg.Workers)
	run := make(chan struct{}, n) // a token per running batch
	rescan := time.NewTicker(cfg.Rescan)
	defer rescan.Stop()

	var (
		mu    sync.Mutex
		busy  = map[int64][]B{} // partitions in hand: the batches queued behind the running one
		inUse int               // batches in hand: running or queued
		freed = make(chan struct{}, 1)
		wg    sync.WaitGroup
		// pending: the loop wants a claim it cannot start yet (no free
		// slot, or claims in flight or backing off).
		pending atomic.Bool
	)
	defer wg.Wait()
	signal := func() {
		select {
		case freed <- struct{}{}:
		default:
		}
	}
	alone := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(busy) <= n
	}
	worker := func(pid int64, batch B) {
		for {
			run <- struct{}{}
			settle := cfg.Handle(batch, alone)
			<-run
			// The handler slot is free once the handlers are done: the
			// settle round trip holds only the partition (its lease, and its
			// place in busy), so other partitions are claimed and handled
			// meanwhile instead of waiting for the commit.
			mu.Lock()
			inUse--
			mu.Unlock()
			if settle != nil {
				if cfg.Keeps == nil || !cfg.Keeps(batch) || pending.Load() {
					signal()
				}
				settle()
			}
			if cfg.Next != nil {
				if b, ok := cfg.Next(batch); ok {
					mu.Lock()
					inUse++
					mu.Unlock()
					batch = b
					continue
				}
			}
			mu.Lock()
			next := busy[pid]
			if len(next) == 0 {
				delete(busy, pid)
				mu.Unlock()
				signal() // the partition is free again: claim it if it has more
				return
			}
			batch, busy[pid] = next[0], next[1:]
			mu.Unlock()
			signal()
		}
	}

	type claimed struct {
		batches []B
		asked   int
		err     error
	}
	results := make(chan claimed, maxInFlight)
	inFlight, most := 0, maxInFlight
	if cfg.Serial {
		most = 1
	}
	// hand releases a claim's reservation and gives every claimed batch to
	// a worker, even when stopping: the worker hands back what it does not
	// start.
	hand := func(r claimed) {
		mu.Lock()
		defer mu.Unlock()
		inUse -= r.asked
		for _, b := range r.batches {
			pid := cfg.Partition(b)
			inUse++
			if queued, ok := busy[pid]; ok {
				busy[pid] = append(queued, b)
				continue
			}
			busy[pid] = nil
			wg.Go(func() { worker(pid, b) })
		}
	}
	defer func() {
		for ; inFlight > 0; inFlight-- {
			hand(<-results)
		}
	}()

	backoffNext := BackoffMin
	var retry <-chan time.Time // set while backing off after a failed claim
	var hints []string
	want := true // claim at once: there may be work, and no wake says so
	// took hands out a claim's batches and arms a backoff if it failed; an
	// error ends the loop.
	took := func(r claimed) error {
		hand(r)
		if r.err != nil {
			wait := backoff.Jitter(backoffNext)
			if err := cfg.Failed(r.err, wait); err != nil {
				// What is in hand finishes.
				return err
			}
			retry = time.After(wait)
			backoffNext = min(2*backoffNext, BackoffMax)
			return nil
		}
		backoffNext = BackoffMin
		// All it asked for was there: more may be ready. Otherwise the
		// ready set was exhausted a moment ago; a push since then wakes.
		want = want || len(r.batches) == r.asked
		return nil
	}
	for stop.Err() == nil {
		mu.Lock()
		free := hold - inUse
		// Claim ahead in steps of a worker's share; claim any amount when a
		// worker would otherwise idle.
		if want && free > 0 && (free >= hold/n || inUse < n) && inFlight < most && retry == nil {
			// With nothing in hand and no claim in flight, the claim runs
			// here: it reserves every slot and no batch can free one while
			// it runs, so the loop would only wait for it, and running it
			// saves two goroutine hand-offs on the idle path (a wake-up
			// each on a small VM). Wakes and ticks wait in their channels.
			// A worker settling a batch it keeps its partition after (Next)
			// counts as nothing in hand: the batch it runs next takes a slot
			// beyond the reservation and gives it back.
			alone := inUse == 0 && inFlight == 0
			inUse += free
			pending.Store(false)
			mu.Unlock()
			h := hints
			hints, want = nil, false
			if alone {
				batches, err := cfg.Claim(stop, h, free)
				if err := took(claimed{batches, free, err}); err != nil {
					return err
				}
				continue
			}
			inFlight++
			go func() {
				batches, err := cfg.Claim(stop, h, free)
				results <- claimed{batches, free, err}
			}()
			continue
		}
		pending.Store(want)
		mu.Unlock()
		select {
		case r := <-results:
			inFlight--
			if err := took(r); err != nil {
				return err
			}
		case <-retry:
			retry, want = nil, true
		case <-stop.Done():
		case <-cfg.Wake.C():
			h := cfg.Wake.TakeHints()
			if len(h) > 0 && cfg.Lingers != nil && cfg.Lingers(h) {
				continue
			}
			hints = append(hints, h...)
			want = true
		case <-freed:
			want = true
		case <-rescan.C:
			want = true
		}
	}
	return nil
}
