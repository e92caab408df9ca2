package queen

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/e03140bc/queen/internal/dispatch"
)

// dispatch is one Consume call's fetch loop (package dispatch): it claims,
// in one round trip, as many ready partitions as it has free workers (up to
// n), hands each partition's batch to a worker, and claims again as soon as
// a worker frees up or a wake arrives, even while a claim is still in
// flight.
//
// With PopOptions.Partitions k > 1 it holds up to n×k batches: claims ask
// for that many, and the batches beyond the n being handled wait in hand for
// a worker (their leases running), so each claim and settle round trip
// carries more messages when batches are small.
func (c *consumer) dispatch(n int) error {
	q := c.q
	e := q.c.e
	// A member of its group while it runs: left once its batches are
	// settled, before Close's wait for the call ends.
	leave := c.join()
	defer leave()
	w := e.wake.Subscribe(q.c.tenant, q.name)
	defer e.wake.Unsubscribe(w)
	po := c.po
	po.Partitions = 1 // a claim of n takes up to n partitions, po.Batch from each
	err := dispatch.Run(c.stop, dispatch.Config[*consumeBatch]{
		Workers: n,
		Hold:    n * max(c.po.Partitions, 1),
		Claim: func(ctx context.Context, hints []string, free int) ([]*consumeBatch, error) {
			e.claims.Pops.Add(int64(free)) // one pop per free worker, in Stats
			groups, err := q.claim(ctx, &po, hints, free)
			c.logClaim(groups)
			bs := make([]*consumeBatch, len(groups))
			for i, g := range groups {
				bs[i] = &consumeBatch{msgs: g}
			}
			return bs, err
		},
		Handle:    c.handleBatch,
		Next:      func(b *consumeBatch) (*consumeBatch, bool) { return b.next, b.next != nil },
		Keeps:     func(b *consumeBatch) bool { return b.keeps },
		Partition: func(b *consumeBatch) int64 { return b.msgs[0].pid },
		Wake:      w,
		Lingers:   c.lingering.covers,
		Rescan:    e.cfg.test.popRescan,
		// AutoAck batches hold no lease: two claims in flight could take
		// consecutive batches of one partition and hand them reversed.
		Serial: c.po.AutoAck,
		Failed: func(err error, wait time.Duration) error {
			if e.isClosed() {
				return ErrClosed
			}
			if errors.Is(err, ErrEncryption) {
				// Misconfigured (a key missing): retrying cannot help.
				// The claim took nothing; what is in hand finishes.
				return err
			}
			e.log.Warn("queen: consume: claim failed; retrying", "queue", q.name, "err", err, "backoff", wait)
			return nil
		},
	})
	if err != nil {
		return err
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
