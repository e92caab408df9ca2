package queen

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// dispatch is one Consume call's fetch loop: it claims, in one round trip,
// as many ready partitions as it has free workers (up to n), hands each
// partition's batch to a worker, and claims again as soon as a worker frees
// up or a wake arrives, even while a claim is still in flight (at most two
// are: each reserves the workers it asked for). Wakes coalesce (a one-slot channel plus collected
// hints) and a claim that found fewer partitions than it asked for waits for
// the next wake, freed worker or rescan tick: it never spins. A partition is
// handled by one worker at a time, in order: the lease guarantees it across
// consumers, and a local queue behind the running batch guarantees it for a
// partition claimed again here while still in hand (after its lease was
// lost, or with AutoAck, which holds no lease).
//
// With PopOptions.Partitions k > 1 it holds up to n×k batches: claims ask
// for that many, and the batches beyond the n being handled wait in hand for
// a worker (their leases running), so each claim and settle round trip
// carries more messages when batches are small.
func (c *consumer) dispatch(n int) error {
	q := c.q
	hold := n * max(c.po.Partitions, 1)
	run := make(chan struct{}, n) // a token per running batch
	e := q.c.e
	w := e.wake.Subscribe(q.c.tenant, q.name)
	defer e.wake.Unsubscribe(w)
	rescan := time.NewTicker(e.cfg.test.popRescan)
	defer rescan.Stop()

	var (
		mu    sync.Mutex
		busy  = map[int64][][]*Message{} // partitions in hand: the batches queued behind the running one
		inUse int                        // batches in hand: running or queued
		freed = make(chan struct{}, 1)
		wg    sync.WaitGroup
	)
	defer wg.Wait()
	signal := func() {
		select {
		case freed <- struct{}{}:
		default:
		}
	}
	worker := func(pid int64, batch []*Message) {
		for batch != nil {
			run <- struct{}{}
			settle := c.handleBatch(batch)
			<-run
			// The handler slot is free once the handlers are done: the
			// settle round trip holds only the partition (its lease, and its
			// place in busy), so other partitions are claimed and handled
			// meanwhile instead of waiting for the commit.
			mu.Lock()
			inUse--
			mu.Unlock()
			if settle != nil {
				signal()
				settle()
			}
			mu.Lock()
			if next := busy[pid]; len(next) > 0 {
				batch, busy[pid] = next[0], next[1:]
			} else {
				delete(busy, pid)
				batch = nil
			}
			mu.Unlock()
			signal() // the partition is free again: claim it if it has more
		}
	}

	// A claim reserves the workers it asks for until it returns; the slots
	// freed meanwhile can start a second claim, so a round trip in flight
	// does not leave the workers that finished during it idle until it
	// returns (with fast handlers, about half of them).
	type claimed struct {
		groups [][]*Message
		asked  int
		err    error
	}
	const maxInFlight = 2
	results := make(chan claimed, maxInFlight)
	inFlight := 0
	// hand releases a claim's reservation and gives every claimed batch to
	// a worker, even when stopping: the worker hands back what it does not
	// start.
	hand := func(r claimed) {
		mu.Lock()
		defer mu.Unlock()
		inUse -= r.asked
		for _, g := range r.groups {
			pid := g[0].pid
			inUse++
			if queued, ok := busy[pid]; ok {
				busy[pid] = append(queued, g)
				continue
			}
			busy[pid] = nil
			wg.Go(func() { worker(pid, g) })
		}
	}
	defer func() {
		for ; inFlight > 0; inFlight-- {
			hand(<-results)
		}
	}()

	po := c.po
	po.Partitions = 1 // claim(free) then takes up to free partitions, po.Batch from each
	const backoffMin = 50 * time.Millisecond
	backoff := backoffMin
	var retry <-chan time.Time // set while backing off after a failed claim
	var hints []string
	want := true // claim at once: there may be work, and no wake says so
	for c.stop.Err() == nil {
		mu.Lock()
		free := hold - inUse
		// Claim ahead in steps of a worker's share; claim any amount when a
		// worker would otherwise idle.
		if want && free > 0 && (free >= hold/n || inUse < n) && inFlight < maxInFlight && retry == nil {
			inUse += free
			mu.Unlock()
			e.claims.Pops.Add(int64(free)) // one pop per free worker, in Stats
			h := hints
			hints, want = nil, false
			inFlight++
			go func() {
				groups, err := q.claim(c.stop, &po, h, free)
				c.logClaim(groups)
				results <- claimed{groups, free, err}
			}()
			continue
		}
		mu.Unlock()
		select {
		case r := <-results:
			inFlight--
			hand(r)
			if r.err != nil {
				if e.isClosed() {
					return ErrClosed
				}
				if errors.Is(r.err, ErrEncryption) {
					// Misconfigured (a key missing): retrying cannot help.
					// The claim took nothing; what is in hand finishes.
					return r.err
				}
				wait := backoffJitter(backoff)
				e.log.Warn("queen: consume: claim failed; retrying", "queue", q.name, "err", r.err, "backoff", wait)
				retry = time.After(wait)
				backoff = min(2*backoff, 5*time.Second)
				continue
			}
			backoff = backoffMin
			// All it asked for was there: more may be ready. Otherwise the
			// ready set was exhausted a moment ago; a push since then wakes.
			want = want || len(r.groups) == r.asked
		case <-retry:
			retry, want = nil, true
		case <-c.stop.Done():
		case <-w.C():
			hints = append(hints, w.TakeHints()...)
			want = true
		case <-freed:
			want = true
		case <-rescan.C:
			want = true
		}
	}
	return c.stopErr()
}

// logClaim logs, at Debug, each batch a claim took: with the handler's own
// records, what tells a message claimed from one handled.
func (c *consumer) logClaim(groups [][]*Message) {
	log := c.q.c.e.log
	if len(groups) == 0 || !log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	for _, g := range groups {
		log.Debug("queen: consume claimed", "queue", c.q.name, "group", g[0].Group, "partition", g[0].Partition,
			"first", g[0].Offset, "last", g[len(g)-1].Offset, "messages", len(g), "lease", g[0].LeaseID)
	}
}
