package queen

import (
	"cmp"
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen/fusion"
)

// querier is what a settle or a bundle runs on: the pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ackItem is one settlement on its way through the ack fusion engine.
type ackItem struct {
	op  settleOp
	st  int16
	sts []int16 // a keyed op's row statuses
	err error
}

// acker folds settlements (acks, fails, retries, dead letters) from many
// consumers into shared settle_v2() transactions, exactly as pushes are fused:
// keyed by (partition, group), one flush in flight per shard, fire on idle.
type acker struct {
	e      *engine
	fusion *fusion.Engine[ackKey, *ackItem]
}

// ackShards is deliberately small: acks are cheap rows, so what costs is the
// per-transaction overhead, and fewer shards (each with one flush in flight)
// make bigger set-based ack batches. Measured with 100 consumers acking each
// message: 1-4 shards within noise of each other, 8 shards 4x slower.
const ackShards = 2

func newAcker(e *engine) *acker {
	a := &acker{e: e}
	a.fusion = fusion.New(fusion.Config{
		Shards:      ackShards,
		BundleMax:   256,
		Hold:        e.cfg.Fusion.Hold,
		MaxInFlight: 1,
		// One flush in flight per shard already bounds acks; a permit
		// limiter on top only adds waits for the Hold tick.
		Limiter: fusion.NewVegas(fusion.VegasConfig{Initial: 1 << 10, Min: 1 << 10, Max: 1 << 10}),
		FlushContext: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(e.ctx, e.cfg.StatementTimeout)
		},
	}, a.flush)
	return a
}

// flush settles a bundle. Pure acks (the common case) are merged per lease
// and committed by one set-based statement; anything else (fail, retry,
// dead letter, release) goes through the general settle_v2() loop.
func (a *acker) flush(ctx context.Context, bundle []*fusion.Batch[ackKey, *ackItem]) error {
	type leaseKey struct {
		pid   int64
		group string
		lease [16]byte
	}
	var (
		general []*ackItem
		keyed   []*ackItem
		pure    = map[leaseKey][]*ackItem{}
		order   []leaseKey
	)
	for _, b := range bundle {
		for _, it := range b.Items {
			if it.op.keyed != nil {
				keyed = append(keyed, it)
				continue
			}
			if it.op.act != actNone || it.op.release {
				general = append(general, it)
				continue
			}
			k := leaseKey{it.op.m.pid, it.op.m.Group, it.op.m.lease}
			if _, ok := pure[k]; !ok {
				order = append(order, k)
			}
			pure[k] = append(pure[k], it)
		}
	}
	var firstErr error
	if len(order) > 0 {
		// One op per lease, through its highest offset: acking P completes
		// every earlier message of the lease.
		pids := make([]int64, len(order))
		groups := make([]string, len(order))
		leases := make([][16]byte, len(order))
		oks := make([]int64, len(order))
		for i, k := range order {
			pids[i], groups[i], leases[i], oks[i] = k.pid, k.group, k.lease, -1
			for _, it := range pure[k] {
				oks[i] = max(oks[i], it.op.ok)
			}
		}
		sts, err := a.e.ackManySQL(ctx, pids, groups, leases, oks)
		for i, k := range order {
			// Acks merged into one op share its verdict: a lower ack is
			// applied by the higher one that commits through it.
			for _, it := range pure[k] {
				if err != nil {
					it.err = err
				} else {
					it.st = sts[i]
				}
			}
		}
		firstErr = err
	}
	if len(general) > 0 {
		ops := make([]settleOp, len(general))
		for i, it := range general {
			ops[i] = it.op
		}
		sts, err := a.e.settleSQL(ctx, a.e.pool, ops)
		if err != nil && len(ops) > 1 && rejectedByServer(err) {
			// One statement carried every consumer's settlement, so one
			// that PostgreSQL rejected failed them all, and nothing was
			// committed: settle each on its own, in order, so the error
			// stays with the settlement that caused it.
			err = nil
			for i, it := range general {
				st, oerr := a.e.settleSQL(ctx, a.e.pool, ops[i:i+1])
				if oerr != nil {
					it.err = oerr
					err = cmp.Or(err, oerr)
				} else {
					it.st = st[0]
				}
			}
		} else {
			for i, it := range general {
				if err != nil {
					it.err = err
				} else {
					it.st = sts[i]
				}
			}
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if len(keyed) > 0 {
		// Out-of-order settlements of every lease in the bundle: one
		// statement, and one at a time only if PostgreSQL rejected it.
		ops := make([]settleOp, len(keyed))
		for i, it := range keyed {
			ops[i] = it.op
		}
		sts, err := a.e.settleKeyedSQL(ctx, a.e.pool, ops)
		if err != nil && len(ops) > 1 && rejectedByServer(err) {
			err = nil
			for i, it := range keyed {
				st, oerr := a.e.settleKeyedSQL(ctx, a.e.pool, ops[i:i+1])
				if oerr != nil {
					it.err = oerr
					err = cmp.Or(err, oerr)
				} else {
					it.sts = st[0]
				}
			}
		} else {
			for i, it := range keyed {
				if err != nil {
					it.err = err
				} else {
					it.sts = sts[i]
				}
			}
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// rejectedByServer reports whether PostgreSQL refused a statement for
// something in it (bad data, a constraint, a raised exception), not because
// the server or the connection is failing, which settling one op at a
// time would only repeat.
func rejectedByServer(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || len(pg.Code) < 2 {
		return false
	}
	switch pg.Code[:2] {
	case "08", "53", "57", "58", "XX": // connection, resources, operator intervention, system, internal
		return false
	}
	return true
}

// ackManySQL runs the set-based pure-ack statement.
func (e *engine) ackManySQL(ctx context.Context, pids []int64, groups []string, leases [][16]byte, oks []int64) ([]int16, error) {
	rows, err := e.pool.Query(ctx, e.csql.AckMany, pids, groups, leases, oks)
	return settleStatuses(rows, err, len(pids), "ack")
}

// ackKey is what ack fusion orders settlements by: a consumer group's
// cursor on one partition.
type ackKey struct {
	pid   int64
	group string
}

func ackKeyOf(op settleOp) ackKey { return ackKey{op.m.pid, op.m.Group} }

// Hash is FNV-1a over the partition id and the group, allocation free.
func (k ackKey) Hash() uint64 {
	h := uint64(14695981039346656037)
	for i := range 8 {
		h = (h ^ uint64(byte(k.pid>>(8*i)))) * 1099511628211
	}
	for i := 0; i < len(k.group); i++ {
		h = (h ^ uint64(k.group[i])) * 1099511628211
	}
	return h
}

// settle applies ops through the ack fusion engine and returns each op's
// status. It returns when every op has been committed (or failed). A
// settlement is never torn by its caller's context: a consumer stopping
// mid-batch must still commit what it handled, and the wait is bounded by
// Config.StatementTimeout.
func (e *engine) settle(ctx context.Context, ops []settleOp) ([]int16, error) {
	if e.isClosed() {
		return nil, ErrClosed
	}
	return e.settleFused(ctx, ops)
}

// settleFused is settle without the closed check, for Consume calls that
// Close stops before it closes the ack engine.
func (e *engine) settleFused(ctx context.Context, ops []settleOp) ([]int16, error) {
	ctx = context.WithoutCancel(ctx)
	items := make([]ackItem, len(ops))
	// One submission per op keeps each op's order within its key.
	groups := func(yield func(ackKey, []*ackItem) bool) {
		for i := range ops {
			items[i].op = ops[i]
			if !yield(ackKeyOf(ops[i]), []*ackItem{&items[i]}) {
				return
			}
		}
	}
	if err := submitAndWait(ctx, e.acks.fusion, len(ops), groups); err != nil {
		return nil, err
	}
	out := make([]int16, len(ops))
	for i := range items {
		if items[i].err != nil {
			return nil, items[i].err
		}
		out[i] = items[i].st
	}
	return out, nil
}

// settleKeyedFused applies one out-of-order settlement through the ack
// fusion engine and returns its row statuses.
func (e *engine) settleKeyedFused(op settleOp) ([]int16, error) {
	var it ackItem
	it.op = op
	groups := func(yield func(ackKey, []*ackItem) bool) {
		yield(ackKeyOf(op), []*ackItem{&it})
	}
	if err := submitAndWait(context.Background(), e.acks.fusion, 1, groups); err != nil {
		return nil, err
	}
	if it.err != nil {
		return nil, it.err
	}
	return it.sts, nil
}

func (a *acker) close(ctx context.Context) error {
	return a.fusion.Close(ctx, func(bundle []*fusion.Batch[ackKey, *ackItem]) {
		for _, b := range bundle {
			for _, it := range b.Items {
				it.err = ErrClosed
			}
		}
	})
}
