package queen

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/fusion"
	"github.com/e03140bc/queen/internal/citus"
)

// loadPlacement reads, on the Citus layout (Config.Citus), which worker
// group holds each shard of the partitions table, so that a bundle can be
// split by worker (byWorker). Read once at Open: after a rebalance moves
// shards, a split may put two workers' partitions in one commit, which
// then takes a two-phase commit (correct, slower) until the next Open.
func (e *engine) loadPlacement(ctx context.Context) error {
	sh, err := citus.Load(ctx, e.pool, pgx.Identifier{e.cfg.Schema, "partitions"}.Sanitize())
	if err != nil {
		return fmt.Errorf("queen: citus placement: %w", err)
	}
	e.placement = sh
	return nil
}

// workerOf is the worker group holding the partition of key, and whether
// it is known: the queue's id must be cached (a queue not created yet has
// none), and the partition's id is taken at probe 0 (a collision moved to
// probe 1 is misplaced: its commit may take a two-phase commit).
func (e *engine) workerOf(k partitionKey) (int32, bool) {
	m, ok := e.meta.Peek(k.Tenant, k.Queue)
	if !ok || m.ID == 0 {
		return 0, false
	}
	sh, ok := e.placement.Of(citus.PartitionKey(m.ID, k.Partition, 0))
	return sh.Group, ok
}

// workerOfID is the worker group holding partition id pid, by the
// placement read at Open (settles split by worker, see settle.Config).
func (e *engine) workerOfID(pid int64) (int32, bool) {
	sh, ok := e.placement.Of(pid)
	return sh.Group, ok
}

// byWorker splits bundle by the worker group of each batch's partition
// when it spans several, so each part commits in one transaction on one
// worker (a transaction writing partitions on two workers is a two-phase
// commit). Batches whose worker is unknown (a new queue) form a part of
// their own, and their queues' settings are read again in the background
// so that the next bundles know. Nil when there is nothing to split: no
// placement (plain PostgreSQL), or one worker.
func (p *pusher) byWorker(bundle []*fusion.Batch[partitionKey, *pushItem]) [][]*fusion.Batch[partitionKey, *pushItem] {
	e := p.e
	if e.placement == nil {
		return nil
	}
	return citus.SplitByGroup(bundle, func(b *fusion.Batch[partitionKey, *pushItem]) (int32, bool) {
		g, known := e.workerOf(b.Key)
		if !known {
			e.meta.Refresh(b.Key.Tenant, b.Key.Queue)
		}
		return g, known
	})
}

// commitParts commits each part of a split bundle on a connection of its
// own, at once, and returns the first error. Each part's items get their
// own verdicts (commit resolves them), so a part that fails spools or
// fails only its items.
func (p *pusher) commitParts(ctx context.Context, parts [][]*fusion.Batch[partitionKey, *pushItem]) error {
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i := 1; i < len(parts); i++ {
		wg.Go(func() { errs[i] = p.commit(ctx, p.e.pool, parts[i], true) })
	}
	errs[0] = p.commit(ctx, p.e.pool, parts[0], true)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
