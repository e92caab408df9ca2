package stmt

import (
	"context"
	"errors"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

// QueueMetaRow is what QueueMeta reads of a queue: the options the push
// path needs.
type QueueMetaRow struct {
	Encryption bool
	Lanes      int32
	// Dedup: the queue has a dedup window. A previous release's statement
	// (see Use) does not read it: it stays false.
	Dedup bool
	// ID is the queue's id, from which a client derives its partitions'
	// ids (internal/citus.PartitionKey). A previous release's statement
	// does not read it: it stays 0.
	ID int64
}

// QueueMeta runs s.QueueMeta for queue on q, or pgx.ErrNoRows when the
// queue does not exist. Fields m has no column for keep their values.
func QueueMeta(ctx context.Context, s *Set, q Querier, queue QueueRef, m *QueueMetaRow) error {
	return scanPrefix(ctx, q, s.QueueMeta, []any{queue.Tenant, queue.Name}, &m.Encryption, &m.Lanes, &m.Dedup, &m.ID)
}

// QueueUpsertParams is the input of QueueUpsert: a queue's options as
// stored. Durations go in whole milliseconds.
type QueueUpsertParams struct {
	Queue QueueRef
	// Lease is how long a claim's lease lasts.
	Lease time.Duration
	// RetryLimit is the failures a message may take (0: none).
	RetryLimit int
	// DeadLetter keeps exhausted messages as dead letters (else drops
	// them).
	DeadLetter bool
	// DedupWindow is how long a transaction id makes a push a duplicate
	// (0: no dedup).
	DedupWindow time.Duration
	Encryption  bool
	// Delayed holds each message back this long after its push;
	// WindowBuffer holds a partition back until it was not written for
	// this long.
	Delayed      time.Duration
	WindowBuffer time.Duration
	// Retention deletes messages this old, CompletedRetention those every
	// group has consumed and this old (0: never).
	Retention          time.Duration
	CompletedRetention time.Duration
	FailurePolicy      string
	// Lanes is the lane count keys are routed with; a queue that has keyed
	// messages keeps its own.
	Lanes int32
	// DeadLetterRetention deletes dead letters this old (0: never). A
	// previous release's statement (see Use) does not write it.
	DeadLetterRetention time.Duration
	// RetryBackoffMin and RetryBackoffMax bound the wait after a charged
	// failure (both 0: none). A previous release's statement does not write
	// them.
	RetryBackoffMin time.Duration
	RetryBackoffMax time.Duration
}

// QueueUpsert runs s.QueueUpsert for in on q: it creates the queue or
// updates its options. False: the queue is keyed and in.Lanes is not its
// lane count, and nothing changed.
func QueueUpsert(ctx context.Context, s *Set, q Querier, in QueueUpsertParams) (bool, error) {
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	var one int
	err := scanPrefix(ctx, q, s.QueueUpsert, prefixArgs(s.QueueUpsert, in.Queue.Tenant, in.Queue.Name, ms(in.Lease), in.RetryLimit,
		in.DeadLetter, ms(in.DedupWindow), in.Encryption, ms(in.Delayed), ms(in.WindowBuffer), ms(in.Retention),
		ms(in.CompletedRetention), in.FailurePolicy, in.Lanes, ms(in.DeadLetterRetention), ms(in.RetryBackoffMin), ms(in.RetryBackoffMax)), &one)
	if isNoRows(err) {
		return false, nil
	}
	return err == nil, err
}

// QueueDelete runs s.QueueDelete for queue on q: it deletes the queue with
// its partitions' data.
func QueueDelete(ctx context.Context, s *Set, q Querier, queue QueueRef) error {
	return exec(ctx, q, s.QueueDelete, queue.Tenant, queue.Name)
}

// MarkKeyed runs s.MarkKeyed for the queues names of tenant on q and
// returns those keyed now. A previous release has no such statement (see
// Use): then it does nothing and returns none.
func MarkKeyed(ctx context.Context, s *Set, q Querier, tenant uuid.UUID, names []string) ([]string, error) {
	if s.MarkKeyed == "" {
		return nil, nil
	}
	rows, err := q.Query(ctx, s.MarkKeyed, tenant, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	return out, rows.Err()
}

// Notify runs s.Notify on q: it sends payload on the schema's channel,
// delivered when q's transaction commits.
func Notify(ctx context.Context, s *Set, q Querier, payload string) error {
	return exec(ctx, q, s.Notify, s.Channel, payload)
}

// NotifyAlone runs s.NotifyAlone on q, outside any transaction: it sends
// payload on the schema's channel and commits without waiting for the
// commit record to reach disk. A notification is not durable anyway (a
// crash loses it, committed or not), and listeners get it at the commit,
// so waiting for the flush only delayed the sender and, on a busy WAL, the
// commits queued behind it: a push's wake-up would otherwise cost a second
// synchronous commit right beside the consumer's claim. Empty with a
// previous release's statements: Notify then.
func NotifyAlone(ctx context.Context, s *Set, q Querier, payload string) error {
	if s.NotifyAlone == "" {
		return Notify(ctx, s, q, payload)
	}
	return exec(ctx, q, s.NotifyAlone, s.Channel, payload)
}

// GetMaintenance runs s.GetMaintenance on q: whether maintenance mode is
// on.
func GetMaintenance(ctx context.Context, s *Set, q Querier) (bool, error) {
	var on bool
	err := scanPrefix(ctx, q, s.GetMaintenance, nil, &on)
	return on, err
}

// SetMaintenance runs s.SetMaintenance on q: it switches maintenance mode.
func SetMaintenance(ctx context.Context, s *Set, q Querier, on bool) error {
	return exec(ctx, q, s.SetMaintenance, on)
}

// exec runs sql with args on q and discards its rows.
func exec(ctx context.Context, q Querier, sql string, args ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
