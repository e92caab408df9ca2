package queen

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"

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
	err error
}

// acker folds settlements (acks, fails, retries, dead letters) from many
// consumers into shared settle() transactions, exactly as pushes are fused:
// keyed by (partition, group), one flush in flight per shard, fire on idle.
type acker struct {
	e      *engine
	fusion *fusion.Engine[*ackItem]
}

func newAcker(e *engine) *acker {
	a := &acker{e: e}
	a.fusion = fusion.New(fusion.Config{
		Shards:      e.cfg.Fusion.Shards,
		BundleMax:   256,
		Hold:        e.cfg.Fusion.Hold,
		MaxInFlight: 1,
		Limiter:     fusion.NewVegas(fusion.VegasConfig{}),
		FlushContext: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(e.ctx, e.cfg.StatementTimeout)
		},
	}, a.flush)
	return a
}

// flush settles a bundle in one call. A settlement is not torn by its caller
// giving up: it runs on the engine's context and the caller only stops
// waiting.
func (a *acker) flush(ctx context.Context, bundle []*fusion.Batch[*ackItem]) error {
	var ops []settleOp
	for _, b := range bundle {
		for _, it := range b.Items {
			ops = append(ops, it.op)
		}
	}
	sts, err := a.e.settleSQL(ctx, a.e.pool, ops)
	k := 0
	for _, b := range bundle {
		for _, it := range b.Items {
			if err != nil {
				it.err = err
			} else {
				it.st = sts[k]
			}
			k++
		}
	}
	return err
}

func ackKey(op settleOp) fusion.Key {
	m := op.m
	return fusion.Key{Tenant: m.q.c.tenant, Queue: strconv.FormatInt(m.pid, 10), Partition: m.Group}
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
	ctx = context.WithoutCancel(ctx)
	items := make([]ackItem, len(ops))
	call := &pushCall{done: make(chan struct{})}
	call.pending.Store(int32(len(ops)))
	for i := range ops {
		items[i].op = ops[i]
		// One submission per op keeps each op's order within its key.
		if err := e.acks.fusion.Submit(ctx, ackKey(ops[i]), []*ackItem{&items[i]}, call.groupDone); err != nil {
			if err == fusion.ErrClosed {
				err = ErrClosed
			}
			return nil, err
		}
	}
	select {
	case <-call.done:
	case <-ctx.Done():
		return nil, ctx.Err()
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

func (a *acker) close(ctx context.Context) error {
	return a.fusion.Close(ctx, func(bundle []*fusion.Batch[*ackItem]) {
		for _, b := range bundle {
			for _, it := range b.Items {
				it.err = ErrClosed
			}
		}
	})
}

