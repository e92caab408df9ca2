package queen

import (
	"context"
	"fmt"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/internal/frame"
)

// maxReroutes bounds how often one push routes its items again; each time
// it reads the queue's settings afresh, so a second one takes a Configure
// racing the first.
const maxReroutes = 3

// sentBack returns the items of the batch the database sent back to be
// routed again (see errLanesChanged), in input order, their results reset.
func (b *pushBatch) sentBack() []*pushItem {
	if !b.routed {
		return nil
	}
	var out []*pushItem
	for i := range b.slab {
		if it := &b.slab[i]; it.takeSentBack() {
			out = append(out, it)
		}
	}
	return out
}

// takeSentBack reports whether it was sent back to be routed again, and if
// so makes it unresolved again.
func (it *pushItem) takeSentBack() bool {
	if it.res == nil || it.res.Status != Failed || it.res.Err != errLanesChanged {
		return false
	}
	it.res.Status, it.res.Err, it.resolved = "", nil, false
	return true
}

// reroute routes items (sent back, in input order) to their lanes under
// lanes, the queue's current count, and groups them by partition, keeping
// their order. Items that cannot be sealed again are failed (see route).
func (e *engine) reroute(tenant uuid.UUID, queue string, items []*pushItem, lanes int32) map[string][]*pushItem {
	groups := make(map[string][]*pushItem)
	for _, it := range e.route(tenant, queue, items, lanes) {
		groups[it.res.Partition] = append(groups[it.res.Partition], it)
	}
	return groups
}

// route routes items to their lanes under lanes and returns those it
// could. An encrypted payload is bound to its partition, so one that moves
// is opened and sealed again for its new lane. Items that cannot be sealed
// again are failed. The partition an item was in is its result's.
func (e *engine) route(tenant uuid.UUID, queue string, items []*pushItem, lanes int32) []*pushItem {
	e.push.rerouted.Add(int64(len(items)))
	out := items[:0:0]
	for _, it := range items {
		old := it.res.Partition
		part := laneOf(it.Key, lanes)
		if part != old && it.Flags&frame.FlagEncrypted != 0 {
			plain, err := e.keys.Open(tenant, queue, old, it.Key, it.Headers, it.ID, it.Payload)
			if err == nil && !e.keys.CanSeal() {
				err = fmt.Errorf("%w: Config.EncryptionKey is not set", ErrEncryption)
			}
			if err != nil {
				resolveFailed(it, fmt.Errorf("queen: route key %q to its lane again: %w", it.Key, err))
				continue
			}
			it.Payload = e.keys.Seal(tenant, queue, part, it.Key, it.Headers, it.ID, plain)
		}
		it.lanes, it.res.Partition = lanes, part
		out = append(out, it)
	}
	return out
}

// rerouteCall is reroute for a whole push call whose items moved were sent
// back: every item of the call routed to a lane goes under lanes, a layer-1
// follower included (two keys that shared a lane under the stale count may
// not share one now), and the call's duplicate check (layer 1: one
// partition, one transaction id) is done again over where the items are
// now. An item already resolved in a partition it keeps leads its
// partition and id; otherwise the first in input order does. It returns
// the new leaders to push, grouped by partition in input order; the new
// followers take their leader's verdict in finish.
func (e *engine) rerouteCall(tenant uuid.UUID, queue string, b *pushBatch, moved []*pushItem, lanes int32) map[string][]*pushItem {
	if b.leaderOf == nil {
		return e.reroute(tenant, queue, moved, lanes)
	}
	// Candidates: the items sent back and every follower, in input order.
	cand := make([]bool, len(b.slab))
	var toRoute []*pushItem
	m := 0
	for i := range b.slab {
		it := &b.slab[i]
		switch {
		case m < len(moved) && moved[m] == it:
			m++
		case b.leaderOf[i] >= 0:
			if it.lanes == 0 {
				cand[i] = true // it stays, but its leader may move
				continue
			}
		default:
			continue
		}
		cand[i] = true
		toRoute = append(toRoute, it)
	}
	e.route(tenant, queue, toRoute, lanes)
	type l1Key struct{ part, txn string }
	leaders := make(map[l1Key]int)
	for i := range b.slab {
		if it := &b.slab[i]; !cand[i] && b.leaderOf[i] < 0 && it.res != nil {
			if _, ok := leaders[l1Key{it.res.Partition, it.TransactionID}]; !ok {
				leaders[l1Key{it.res.Partition, it.TransactionID}] = i
			}
		}
	}
	groups := make(map[string][]*pushItem)
	for i := range b.slab {
		it := &b.slab[i]
		if !cand[i] {
			continue
		}
		b.leaderOf[i] = -1
		if it.resolved { // failed to route
			continue
		}
		k := l1Key{it.res.Partition, it.TransactionID}
		if l, ok := leaders[k]; ok {
			b.leaderOf[i] = l
			continue
		}
		leaders[k] = i
		groups[k.part] = append(groups[k.part], it)
	}
	return groups
}

// rerouteLoop is the end of Push for a batch with items routed to lanes:
// while the database sends items back (a stale lane count), it reads the
// queue's settings again and pushes them to their lanes under the current
// count, as Push does. If the settings cannot be read, the items are
// spooled where they are, and their replay routes them again.
func (q *Queue) rerouteLoop(ctx context.Context, b *pushBatch) error {
	e := q.c.e
	key := partitionKey{Tenant: q.c.tenant, Queue: q.name}
	for n := 0; ; n++ {
		moved := b.sentBack()
		if len(moved) == 0 {
			return nil
		}
		if n == maxReroutes {
			for _, it := range moved {
				resolveFailed(it, fmt.Errorf("%w: gave up after %d attempts", errLanesChanged, n))
			}
			return nil
		}
		meta, err := e.queueMeta(ctx, q.c.tenant, q.name)
		switch {
		case e.isClosed():
			return ErrClosed
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			for _, it := range moved {
				k := key
				k.Partition = it.res.Partition
				e.spoolItems([]*pushItem{it}, k, err)
			}
			return nil
		}
		groups := e.rerouteCall(q.c.tenant, q.name, b, moved, max(meta.Lanes, 1))
		if e.maintOn.Load() {
			for part, g := range groups {
				k := key
				k.Partition = part
				e.spoolItems(g, k, errMaintenance)
				delete(groups, part)
			}
		}
		e.spoolBehind(q.c.tenant, q.name, groups)
		if len(groups) == 0 {
			continue
		}
		seq := func(yield func(partitionKey, []*pushItem) bool) {
			for part, g := range groups {
				k := key
				k.Partition = part
				if !yield(k, g) {
					return
				}
			}
		}
		if err := submitAndWait(ctx, e.push.fusion, len(groups), seq); err != nil {
			return err
		}
	}
}
