package stmt

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
)

// Querier is what a statement runs on: a pool, a connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Lease is what a settlement applies to: a consumer group's lease on one
// partition.
type Lease struct {
	Partition int64
	Group     string
	ID        uuid.UUID
}

// Kept is a message as a failure or a dead letter keeps it: its frame as
// stored (the payload sealed on an encrypted queue) and when it was pushed.
// A dead letter stores all of it; a failure the skip policy re-enqueues
// appends the frame at the partition's tail. Other actions need none.
type Kept struct {
	Frame     frame.Frame
	CreatedAt time.Time
}

// SettleParams is one input of Settle: commit Lease's cursor through
// Through (-1: not at all), then apply Act to the message at offset At (-1
// with ActNone), whose Kept an ActFail or ActDeadLetter needs; Release also
// ends the lease. RetryAfter, with ActFail, is the wait before the next
// attempt the handler asked for (0: the queue's RetryBackoff).
type SettleParams struct {
	Lease      Lease
	Through    int64
	Act        int16
	At         int64
	Kept       *Kept
	Release    bool
	Reason     string
	RetryAfter time.Duration
}

// SettleKeyedParams is one row of SettleKeyed: Act on the message at
// Offset alone (ActCarry: no outcome, Offset names the batch's last
// message; ActPark likewise, for a batch left with waiting keys only), whose
// Kept an ActFail or ActDeadLetter needs; Release also ends the lease.
// RetryAfter, with ActFail, is the wait the handler asked for before the
// message's next attempt, in place or as a skip-policy copy (0: the
// queue's RetryBackoff).
type SettleKeyedParams struct {
	Lease      Lease
	Offset     int64
	Act        int16
	Kept       *Kept
	Release    bool
	Reason     string
	RetryAfter time.Duration
}

// AckManyParams is one input of AckMany: commit Lease's cursor through
// Through.
type AckManyParams struct {
	Lease   Lease
	Through int64
}

// snapshot is the dead-letter snapshot columns of Settle and SettleKeyed,
// one row per input: filled for a failure or a dead letter, zero for every
// other action; a failure also carries its re-enqueue segment.
type snapshot struct {
	ids   []uuid.UUID
	txns  []string
	flags []int32
	pay   [][]byte
	at    []time.Time
	keys  []string
	hdrs  [][]byte
	blobs [][]byte
}

func newSnapshot(n int) snapshot {
	return snapshot{
		ids: make([]uuid.UUID, 0, n), txns: make([]string, 0, n), flags: make([]int32, 0, n),
		pay: make([][]byte, 0, n), at: make([]time.Time, 0, n), keys: make([]string, 0, n),
		hdrs: make([][]byte, 0, n), blobs: make([][]byte, 0, n),
	}
}

func (s *snapshot) add(act int16, k *Kept) {
	var (
		f    frame.Frame
		at   time.Time
		blob []byte
	)
	if k != nil && (act == ActFail || act == ActDeadLetter) {
		f, at = k.Frame, k.CreatedAt
		if act == ActFail {
			blob = segment.Single(&k.Frame)
		}
	}
	s.ids, s.txns, s.flags = append(s.ids, f.ID), append(s.txns, f.TransactionID), append(s.flags, int32(f.Flags))
	s.pay, s.at, s.keys = append(s.pay, f.Payload), append(s.at, at), append(s.keys, f.Key)
	s.hdrs, s.blobs = append(s.hdrs, f.Headers), append(s.blobs, blob)
}

// Settle runs c.Settle for in on q and returns each input's status (a
// Settle… constant), in input order.
func Settle(ctx context.Context, c *Consume, q Querier, in []SettleParams) ([]int16, error) {
	n := len(in)
	var (
		pids     = make([]int64, n)
		groups   = make([]string, n)
		leases   = make([]uuid.UUID, n)
		throughs = make([]int64, n)
		acts     = make([]int16, n)
		actOffs  = make([]int64, n)
		releases = make([]bool, n)
		reasons  = make([]string, n)
		waits    = make([]int64, n)
		snap     = newSnapshot(n)
	)
	for i, p := range in {
		pids[i], groups[i], leases[i] = p.Lease.Partition, p.Lease.Group, p.Lease.ID
		throughs[i], acts[i], actOffs[i], releases[i], reasons[i] = p.Through, p.Act, p.At, p.Release, p.Reason
		waits[i] = p.RetryAfter.Milliseconds()
		snap.add(p.Act, p.Kept)
	}
	rows, err := q.Query(ctx, c.Settle, prefixArgs(c.Settle, pids, groups, leases, throughs, acts, actOffs, releases, reasons,
		snap.ids, snap.txns, snap.flags, snap.pay, snap.at, snap.keys, snap.hdrs, snap.blobs, waits)...)
	return statuses(rows, err, n, "settle")
}

// SettleKeyed runs c.SettleKeyed for in on q and returns each row's
// status, in row order.
func SettleKeyed(ctx context.Context, c *Consume, q Querier, in []SettleKeyedParams) ([]int16, error) {
	n := len(in)
	var (
		pids     = make([]int64, n)
		groups   = make([]string, n)
		leases   = make([]uuid.UUID, n)
		offs     = make([]int64, n)
		acts     = make([]int16, n)
		releases = make([]bool, n)
		reasons  = make([]string, n)
		waits    = make([]int64, n)
		snap     = newSnapshot(n)
	)
	for i, p := range in {
		pids[i], groups[i], leases[i] = p.Lease.Partition, p.Lease.Group, p.Lease.ID
		offs[i], acts[i], releases[i], reasons[i] = p.Offset, p.Act, p.Release, p.Reason
		waits[i] = p.RetryAfter.Milliseconds()
		snap.add(p.Act, p.Kept)
	}
	rows, err := q.Query(ctx, c.SettleKeyed, prefixArgs(c.SettleKeyed, pids, groups, leases, offs, acts, releases, reasons,
		snap.ids, snap.txns, snap.flags, snap.pay, snap.at, snap.keys, snap.hdrs, snap.blobs, waits)...)
	return statuses(rows, err, n, "settle")
}

// AckMany runs c.AckMany for in on q and returns each input's status, in
// input order. At most one input per (partition, group).
func AckMany(ctx context.Context, c *Consume, q Querier, in []AckManyParams) ([]int16, error) {
	n := len(in)
	pids, groups, leases, throughs := make([]int64, n), make([]string, n), make([]uuid.UUID, n), make([]int64, n)
	for i, p := range in {
		pids[i], groups[i], leases[i], throughs[i] = p.Lease.Partition, p.Lease.Group, p.Lease.ID, p.Through
	}
	rows, err := q.Query(ctx, c.AckMany, pids, groups, leases, throughs)
	return statuses(rows, err, n, "ack")
}

// statuses reads the (ord, status, committed) rows of Settle, SettleKeyed
// or AckMany: one per input, in input order, or an error.
func statuses(rows pgx.Rows, err error, n int, what string) ([]int16, error) {
	if err != nil {
		return nil, fmt.Errorf("queen: %s: %w", what, err)
	}
	defer rows.Close()
	out := make([]int16, 0, n)
	for rows.Next() {
		var ord int32
		var st int16
		var committed *int64
		if err := rows.Scan(&ord, &st, &committed); err != nil {
			return nil, fmt.Errorf("queen: %s: %w", what, err)
		}
		if int(ord) != len(out)+1 {
			return nil, fmt.Errorf("queen: %s: result %d out of order", what, ord)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("queen: %s: %w", what, err)
	}
	if len(out) != n {
		return nil, fmt.Errorf("queen: %s: %d results for %d inputs", what, len(out), n)
	}
	return out, nil
}
