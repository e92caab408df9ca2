package queen

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen/internal/stmt"
)

// ResetTo says where ResetGroup moves a group's cursors: build it with
// ResetEarliest, ResetLatest, ResetToTime or ResetToOffsets.
type ResetTo struct {
	to      string
	at      time.Time
	offsets map[string]int64
}

// ResetEarliest moves the cursors so the next delivery on each partition
// is its oldest retained message: the group reads everything again.
func ResetEarliest() ResetTo { return ResetTo{to: "earliest"} }

// ResetLatest moves the cursors past everything now stored: the group
// reads only what is pushed after the reset.
func ResetLatest() ResetTo { return ResetTo{to: "latest"} }

// ResetToTime moves the cursors so the next delivery on each partition is
// the first message stored at or after t (the oldest retained one when
// retention removed what came earlier; nothing now present when every
// message is older).
func ResetToTime(t time.Time) ResetTo { return ResetTo{to: "time", at: t} }

// ResetToOffsets moves the cursor of each named partition so that its next
// delivery is the given offset (Message.Offset), clamped to what is
// retained: an offset retention removed gives the oldest retained message,
// and one past the partition's newest message (LastOffset + 1 or more)
// gives the next message pushed, as ResetLatest. Only the named partitions
// move; offsets must not be negative.
func ResetToOffsets(next map[string]int64) ResetTo { return ResetTo{to: "offsets", offsets: next} }

// ResetOptions tunes ResetGroup.
type ResetOptions struct {
	// Partitions restricts ResetEarliest, ResetLatest and ResetToTime to
	// these partitions; empty: every partition of the queue.
	// ResetToOffsets names its own and ignores it.
	Partitions []string
	// Force resets even while the group holds live leases on the queue:
	// the leases on the moved cursors end, their holders' later Ack,
	// Fail, Retry, DeadLetter and ExtendLease get ErrLeaseLost (a Consume
	// abandons the batch as on any lease loss), and their messages are
	// not charged a failure.
	Force bool
}

// OffsetMove is what ResetGroup did to one partition's cursor. Offsets
// are committed offsets, as GroupStatus.Committed: the next delivery is
// After + 1.
type OffsetMove struct {
	Partition string
	// Before is the cursor's committed offset before the reset; for a
	// cursor the reset created (Created), where the group's subscription
	// would have started it.
	Before, After int64
	Created       bool
	// LeaseEnded reports that Force ended a live lease on the partition.
	LeaseEnded bool
}

// ResetGroup moves group's cursors on the queue ("" is queue mode) to
// where to says, on every partition (or those o names), and returns what
// it did per partition, by name. A moved cursor also loses what was
// settled out of order above it (KeyConcurrency > 1), its retry backoff
// wait and the failures charged to its messages (the retry budget starts
// afresh) and its delivery count. A partition on which the group has no
// cursor yet gets one at the reset's position, so ResetLatest holds there
// too; a partition created after the reset starts as the group's
// subscription says. A group not yet subscribed is subscribed by the
// reset, as its first Pop would: SubscribeNew for ResetLatest,
// SubscribeFrom at t for ResetToTime, else SubscribeAll (queue mode is
// always all). Pause is left as it is. Consumers of the group are woken.
//
// It is refused with ErrGroupActive while the group holds a live lease on
// the queue or has a live member (see Member), unless o.Force, which
// also ends the leases; running consumers then claim from the new
// position. An unknown queue or partition is ErrNotFound.
// It is one transaction: all or nothing. A claim or settlement that
// commits before it is overridden; one after it claims from the new
// position, or finds its lease lost.
func (q *Queue) ResetGroup(ctx context.Context, group string, to ResetTo, o ResetOptions) ([]OffsetMove, error) {
	e := q.c.e
	if err := q.checkGroup(group); err != nil {
		return nil, err
	}
	p := stmt.ResetParams{Queue: stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, Group: group, To: to.to, Force: o.Force}
	switch to.to {
	case "earliest", "latest", "time":
		if to.to == "time" {
			p.At = &to.at
		}
		if len(o.Partitions) > 0 {
			seen := map[string]bool{}
			for _, name := range o.Partitions {
				if err := checkName(nameStoredPartition, name); err != nil {
					return nil, err
				}
				if !seen[name] {
					seen[name] = true
					p.Partitions = append(p.Partitions, name)
				}
			}
		}
	case "offsets":
		if len(to.offsets) == 0 {
			return nil, errors.New("queen: ResetGroup: ResetToOffsets names no partition")
		}
		for name := range to.offsets {
			if err := checkName(nameStoredPartition, name); err != nil {
				return nil, err
			}
			p.Partitions = append(p.Partitions, name)
		}
		sort.Strings(p.Partitions)
		for _, name := range p.Partitions {
			off := to.offsets[name]
			if off < 0 {
				return nil, fmt.Errorf("queen: ResetGroup: offset %d of partition %q is negative", off, name)
			}
			p.Offsets = append(p.Offsets, off)
		}
	default:
		return nil, errors.New("queen: ResetGroup: a ResetTo made by ResetEarliest, ResetLatest, ResetToTime or ResetToOffsets")
	}
	if e.csql.ResetGroup == "" {
		return nil, errOffsetsUnsupported
	}
	var rows []stmt.ResetRow
	err := e.onLayout(ctx, func() (err error) {
		rows, err = stmt.ResetGroup(ctx, e.csql, e.pool, p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("queen: reset group %q of %q: %w", group, q.name, offsetsErr(err))
	}
	out := make([]OffsetMove, len(rows))
	for i, r := range rows {
		out[i] = OffsetMove{Partition: r.Partition, Before: r.Before, After: r.After, Created: r.Created, LeaseEnded: r.LeaseEnded}
	}
	e.wake.Woken(q.c.tenant, q.name)
	return out, nil
}

// DeleteGroupOptions tunes DeleteGroup.
type DeleteGroupOptions struct {
	// Force deletes the group even while it holds live leases on the
	// queue. Their holders' later settlements get ErrUnknownMessage (the
	// cursor is gone; ErrLeaseLost once the group is re-created) and
	// ExtendLease ErrLeaseLost; a Consume abandons the batch.
	Force bool
}

// GroupDeleted is what DeleteGroup removed.
type GroupDeleted struct {
	Cursors     int // the group's cursors, one per partition it had met
	LeasesEnded int // how many of them held a live lease (Force)
}

// DeleteGroup removes consumer group group ("" is queue mode) from the
// queue: its cursors, what was settled out of order above them, its
// subscription and its pause. Completed retention (QueueOptions.
// CompletedRetention) no longer waits for it. It is refused with
// ErrGroupActive while the group holds a live lease on the queue or has
// a live member, unless o.Force; a queue or group that does not exist is ErrNotFound. One
// transaction.
//
// A Consume or Pop of the group still running afterwards re-creates it
// as a new group on its next claim, subscribed as that call's
// PopOptions say (Kafka does the same): stop the group's consumers first.
func (q *Queue) DeleteGroup(ctx context.Context, group string, o DeleteGroupOptions) (GroupDeleted, error) {
	e := q.c.e
	if err := q.checkGroup(group); err != nil {
		return GroupDeleted{}, err
	}
	if e.csql.DeleteGroup == "" {
		return GroupDeleted{}, errOffsetsUnsupported
	}
	var c, l int32
	err := e.onLayout(ctx, func() (err error) {
		c, l, err = stmt.DeleteGroup(ctx, e.csql, e.pool, stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, group, o.Force)
		return err
	})
	if err != nil {
		return GroupDeleted{}, fmt.Errorf("queen: delete group %q of %q: %w", group, q.name, offsetsErr(err))
	}
	return GroupDeleted{Cursors: int(c), LeasesEnded: int(l)}, nil
}

// ReleaseLease ends group's live lease on partition now, as if it had
// expired, and reports whether there was one. Its messages go to the next
// claim of the group, which is woken; they are not charged a failure and
// their delivery is not counted (Message.Attempt is as before the lease).
// The holder's later Ack, Fail, Retry, DeadLetter and ExtendLease get
// ErrLeaseLost, and a Consume holding it abandons the batch as on any
// lease loss. An unknown queue or partition is ErrNotFound; a group with
// no lease there is (false, nil). Released again and again faster than
// its holders get from a claim to its ack, a partition makes no progress:
// each release takes back a batch in flight.
func (q *Queue) ReleaseLease(ctx context.Context, group, partition string) (bool, error) {
	e := q.c.e
	if err := q.checkGroup(group); err != nil {
		return false, err
	}
	if err := checkName(nameStoredPartition, partition); err != nil {
		return false, err
	}
	if e.csql.ReleaseLease == "" {
		return false, errOffsetsUnsupported
	}
	var ok bool
	err := e.onLayout(ctx, func() (err error) {
		ok, err = stmt.ReleaseLease(ctx, e.csql, e.pool, stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, group, partition)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("queen: release lease of group %q on %q/%q: %w", group, q.name, partition, offsetsErr(err))
	}
	if ok {
		e.wake.Woken(q.c.tenant, q.name)
	}
	return ok, nil
}

// errOffsetsUnsupported is the answer of a client running a previous
// release's statements (stmt.Use), which have none for these calls.
var errOffsetsUnsupported = errors.New("queen: the statement set in use has no offsets statements")

// offsetsErr maps the offsets functions' SQLSTATEs to their sentinels,
// keeping the database's message for a missing name (which one).
func offsetsErr(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case stmt.CodeNotFound:
			return fmt.Errorf("%w: %s", ErrNotFound, pg.Message)
		case stmt.CodeGroupActive:
			return ErrGroupActive
		}
	}
	return err
}
