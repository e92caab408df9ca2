// Package settle applies consumers' settlements (acks, failures, retries,
// dead letters, lease releases) to the database. Settlements from every
// consumer of a client are folded into shared statements by a fusion
// engine keyed by cursor, (partition, group), as pushes are: one flush in
// flight per shard, fire on idle. An isolated settlement (one op, its
// shard holding nothing) commits on its caller's goroutine, with no
// hand-off (fusion's Config.Inline); every other one, and every one
// arriving meanwhile, is fused as before. It knows queen's settle
// statements and nothing of its messages: an Op carries the lease and the
// message as stored.
//
// Cancellation: none, inline or not. A settlement's statement runs to
// completion, within Config.Timeout, whatever its caller's context does: a
// consumer stopping mid-batch must still commit what it handled, and a
// settlement cut off mid-statement would leave its caller an unknown
// outcome and the messages redelivered. An inline flush carries only its
// caller's op, so running it to completion costs no one else a wait.
package settle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen/fusion"
	"github.com/e03140bc/queen/internal/citus"
	"github.com/e03140bc/queen/internal/errs"
	"github.com/e03140bc/queen/internal/stmt"
)

// Op is one lease's settlement: Settle's input, or with Keyed set an
// out-of-order settlement (per-key Consume), one row per message, all of
// one lease; Settle is unused then.
type Op struct {
	Settle stmt.SettleParams
	Keyed  []stmt.SettleKeyedParams
}

func (op *Op) lease() stmt.Lease {
	if op.Keyed != nil {
		return op.Keyed[0].Lease
	}
	return op.Settle.Lease
}

// Result is an Op's outcome: Status for a Settle op, one status per row in
// Statuses for a keyed one (stmt's Settle… constants), or Err.
type Result struct {
	Status   int16
	Statuses []int16
	Err      error
}

// Config is what a Fusion needs.
type Config struct {
	Pool stmt.Querier
	SQL  *stmt.Consume
	// Hold is how long a shard waits for more settlements once one arrived
	// while another flush is in flight (fusion.Config.Hold).
	Hold time.Duration
	// Timeout bounds each flush's statements.
	Timeout time.Duration
	// Worker, when set (the Citus layout), names the worker group holding
	// a partition: a flush whose settlements span groups commits one part
	// per group, each on its own connection, since one transaction
	// writing two workers' cursors is a two-phase commit. ok false: not
	// known, its own part.
	Worker func(pid int64) (group int32, ok bool)
}

// Shards is deliberately small: acks are cheap rows, so what costs is the
// per-transaction overhead, and fewer shards (each with one flush in flight)
// make bigger set-based ack batches. Measured with 100 consumers acking each
// message: 1-4 shards within noise of each other, 8 shards 4x slower.
const Shards = 2

// ErrNoVerdict is returned (wrapped) by a Settle whose ops were not resolved
// within twice Config.Timeout: they may still commit.
var ErrNoVerdict = errors.New("settle: no verdict")

// BundleMax caps the settlements one flush carries.
const BundleMax = 256

// Fusion folds settlements into shared statements. Its goroutines are the
// fusion engine's, and an isolated Settle runs its statement on its own;
// Close stops them and waits for those.
type Fusion struct {
	cfg    Config
	fusion *fusion.Engine[key, *item]
}

// key is what settlements are ordered by: a consumer group's cursor on one
// partition.
type key struct {
	pid   int64
	group string
}

// Hash is FNV-1a over the partition id and the group, allocation free.
func (k key) Hash() uint64 {
	h := uint64(14695981039346656037)
	for i := range 8 {
		h = (h ^ uint64(byte(k.pid>>(8*i)))) * 1099511628211
	}
	for i := 0; i < len(k.group); i++ {
		h = (h ^ uint64(k.group[i])) * 1099511628211
	}
	return h
}

type item struct {
	op  Op
	res Result
}

// New starts a Fusion whose flushes run under ctx (the client's: cancelled
// last, after Close).
func New(ctx context.Context, cfg Config) *Fusion {
	f := &Fusion{cfg: cfg}
	f.fusion = fusion.New(fusion.Config{
		Shards:      Shards,
		BundleMax:   BundleMax,
		Hold:        cfg.Hold,
		MaxInFlight: 1,
		// An isolated settlement commits on its caller's goroutine: on a
		// small VM each hand-off is a wake-up costing about what the
		// statement does.
		Inline: true,
		// One flush in flight per shard already bounds acks; a permit
		// limiter on top only adds waits for the Hold tick.
		Limiter: fusion.NewVegas(fusion.VegasConfig{Initial: 1 << 10, Min: 1 << 10, Max: 1 << 10}),
		FlushContext: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, cfg.Timeout)
		},
	}, f.flush)
	return f
}

func (f *Fusion) flush(ctx context.Context, bundle []*fusion.Batch[key, *item]) error {
	if parts := f.byWorker(bundle); parts != nil {
		errs := make([]error, len(parts))
		var wg sync.WaitGroup
		for i := 1; i < len(parts); i++ {
			wg.Go(func() { errs[i] = f.apply(ctx, parts[i]) })
		}
		errs[0] = f.apply(ctx, parts[0])
		wg.Wait()
		return cmp.Or(errs...)
	}
	return f.apply(ctx, bundle)
}

// apply commits bundle's settlements and gives each item its result.
func (f *Fusion) apply(ctx context.Context, bundle []*fusion.Batch[key, *item]) error {
	var ops []Op
	for _, b := range bundle {
		for _, it := range b.Items {
			ops = append(ops, it.op)
		}
	}
	res, err := Apply(ctx, f.cfg.SQL, f.cfg.Pool, ops)
	i := 0
	for _, b := range bundle {
		for _, it := range b.Items {
			it.res = res[i]
			i++
		}
	}
	return err
}

// byWorker splits bundle by the worker group of each cursor's partition
// when it spans several (see Config.Worker), keeping the order within
// each part; nil when there is nothing to split.
func (f *Fusion) byWorker(bundle []*fusion.Batch[key, *item]) [][]*fusion.Batch[key, *item] {
	if f.cfg.Worker == nil || len(bundle) < 2 {
		return nil
	}
	return citus.SplitByGroup(bundle, func(b *fusion.Batch[key, *item]) (int32, bool) { return f.cfg.Worker(b.Key.pid) })
}

// Settle applies ops, fused with other callers' settlements, and returns
// each op's Result once every op has been committed (or failed). One op
// whose shard holds nothing is committed on the caller's goroutine, alone.
// A settlement is never torn by its caller's context, inline or not: a
// consumer stopping mid-batch must still commit what it handled. An inline
// statement is bounded by Config.Timeout; the wait is bounded by twice
// Config.Timeout (the flush in flight when it arrived, then its own): while
// the database hangs, flushes queue up behind one another, and a caller
// must not wait them all out. An error then (ErrNoVerdict) leaves the
// outcome unknown: the ops may still commit later, which callers tolerate,
// since a settlement applied twice or late is refused or ignored. It returns
// errs.ErrClosed once Close has begun.
func (f *Fusion) Settle(ctx context.Context, ops []Op) ([]Result, error) {
	ctx = context.WithoutCancel(ctx)
	if f.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*f.cfg.Timeout)
		defer cancel()
	}
	items := make([]item, len(ops))
	// One submission per op keeps each op's order within its key.
	groups := func(yield func(key, []*item) bool) {
		for i := range ops {
			items[i].op = ops[i]
			l := ops[i].lease()
			if !yield(key{l.Partition, l.Group}, []*item{&items[i]}) {
				return
			}
		}
	}
	if err := f.fusion.SubmitWait(ctx, len(ops), groups); err != nil {
		switch {
		case err == fusion.ErrClosed:
			err = errs.ErrClosed
		case errors.Is(err, context.DeadlineExceeded):
			err = fmt.Errorf("%w within %v: %w", ErrNoVerdict, 2*f.cfg.Timeout, err)
		}
		return nil, err
	}
	out := make([]Result, len(items))
	for i := range items {
		out[i] = items[i].res
	}
	return out, nil
}

// Stats is the fusion engine's counters: Bundles are the flushes run and
// Items the settlements they carried; Inline counts the flushes run on a
// caller's goroutine.
func (f *Fusion) Stats() fusion.Stats { return f.fusion.Stats() }

// Close flushes what was submitted, within ctx; what ctx cuts off fails
// with errs.ErrClosed.
func (f *Fusion) Close(ctx context.Context) error {
	return f.fusion.Close(ctx, func(bundle []*fusion.Batch[key, *item]) {
		for _, b := range bundle {
			for _, it := range b.Items {
				it.res.Err = errs.ErrClosed
			}
		}
	})
}

// Apply settles ops on q, unfused, and returns one Result per op and the
// first error. Pure acks (the common case) are merged per lease and
// committed by one set-based statement; anything else (fail, retry, dead
// letter, release) goes through the general Settle statement, and keyed ops
// through SettleKeyed: at most three statements, each on its own.
func Apply(ctx context.Context, sql *stmt.Consume, q stmt.Querier, ops []Op) ([]Result, error) {
	res := make([]Result, len(ops))
	var (
		general, keyed []int
		pure           = map[stmt.Lease][]int{}
		order          []stmt.Lease
	)
	for i := range ops {
		op := &ops[i]
		switch {
		case op.Keyed != nil:
			keyed = append(keyed, i)
		case op.Settle.Act != stmt.ActNone || op.Settle.Release:
			general = append(general, i)
		default:
			l := op.Settle.Lease
			if _, ok := pure[l]; !ok {
				order = append(order, l)
			}
			pure[l] = append(pure[l], i)
		}
	}
	var firstErr error
	if len(order) > 0 {
		// One op per lease, through its highest offset: acking P completes
		// every earlier message of the lease.
		in := make([]stmt.AckManyParams, len(order))
		for k, l := range order {
			in[k] = stmt.AckManyParams{Lease: l, Through: -1}
			for _, i := range pure[l] {
				in[k].Through = max(in[k].Through, ops[i].Settle.Through)
			}
		}
		sts, err := stmt.AckMany(ctx, sql, q, in)
		for k, l := range order {
			// Acks merged into one op share its verdict: a lower ack is
			// applied by the higher one that commits through it.
			for _, i := range pure[l] {
				if err != nil {
					res[i].Err = err
				} else {
					res[i].Status = sts[k]
				}
			}
		}
		firstErr = err
	}
	if len(general) > 0 {
		err := each(general, func(idx []int) error {
			in := make([]stmt.SettleParams, len(idx))
			for k, i := range idx {
				in[k] = ops[i].Settle
			}
			sts, err := stmt.Settle(ctx, sql, q, in)
			for k, i := range idx {
				if err != nil {
					res[i] = Result{Err: err}
				} else {
					res[i] = Result{Status: sts[k]}
				}
			}
			return err
		})
		firstErr = cmp.Or(firstErr, err)
	}
	if len(keyed) > 0 {
		err := each(keyed, func(idx []int) error {
			var in []stmt.SettleKeyedParams
			for _, i := range idx {
				in = append(in, ops[i].Keyed...)
			}
			sts, err := stmt.SettleKeyed(ctx, sql, q, in)
			for _, i := range idx {
				if err != nil {
					res[i] = Result{Err: err}
					continue
				}
				n := len(ops[i].Keyed)
				res[i], sts = Result{Statuses: sts[:n:n]}, sts[n:]
			}
			return err
		})
		firstErr = cmp.Or(firstErr, err)
	}
	return res, firstErr
}

// each runs one statement for every op in idx, and, when PostgreSQL
// rejected it and it carried more than one, one statement per op in order:
// one statement carried every consumer's settlement, so one that PostgreSQL
// rejected failed them all and nothing was committed; on their own, the
// error stays with the settlement that caused it. It returns the first
// error.
func each(idx []int, run func(idx []int) error) error {
	err := run(idx)
	if err == nil || len(idx) == 1 || !rejectedByServer(err) {
		return err
	}
	err = nil
	for k := range idx {
		err = cmp.Or(err, run(idx[k:k+1]))
	}
	return err
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

// InTx applies ops on tx (a caller's transaction) and returns each op's
// status; a keyed op must have one row. The statements follow the ops in
// ascending (partition, group), one per run of a kind, so the cursor rows
// are locked in the global order even when both kinds are mixed.
func InTx(ctx context.Context, sql *stmt.Consume, tx stmt.Querier, ops []Op) ([]int16, error) {
	idx := make([]int, len(ops))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		la, lb := ops[a].lease(), ops[b].lease()
		return cmp.Or(cmp.Compare(la.Partition, lb.Partition), cmp.Compare(la.Group, lb.Group))
	})
	out := make([]int16, len(ops))
	for len(idx) > 0 {
		keyed := ops[idx[0]].Keyed != nil
		n := 1
		for n < len(idx) && (ops[idx[n]].Keyed != nil) == keyed {
			n++
		}
		var (
			sts []int16
			err error
		)
		if keyed {
			in := make([]stmt.SettleKeyedParams, n)
			for k, i := range idx[:n] {
				in[k] = ops[i].Keyed[0]
			}
			sts, err = stmt.SettleKeyed(ctx, sql, tx, in)
		} else {
			in := make([]stmt.SettleParams, n)
			for k, i := range idx[:n] {
				in[k] = ops[i].Settle
			}
			sts, err = stmt.Settle(ctx, sql, tx, in)
		}
		if err != nil {
			return nil, err
		}
		for k, i := range idx[:n] {
			out[i] = sts[k]
		}
		idx = idx[n:]
	}
	return out, nil
}
