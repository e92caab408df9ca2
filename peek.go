package queen

import (
	"context"
	"fmt"

	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/stmt"
)

// PeekOptions are the options of one Peek.
type PeekOptions struct {
	// Partition restricts the peek to one partition. Defaults to "": every
	// partition of the queue, in byte order of their names.
	Partition string
	// From is the first offset read in each partition; offsets below a
	// partition's oldest retained message read from that message. Defaults
	// to 0.
	From int64
	// Limit is the most messages returned, across all partitions. Defaults
	// to DefaultPeekLimit; at most MaxBatch.
	Limit int
}

// Peek reads the messages the queue holds without leasing them and without
// moving any cursor: what a new consumer group subscribed with SubscribeAll
// would see, whatever any group has already consumed, and also messages
// not deliverable yet (DelayedProcessing, WindowBuffer). Messages come by
// partition (in byte order of the partition names), then by offset, from
// offset o.From on; each carries its Partition and Offset. Payloads are
// decrypted and keys and headers decoded as Pop does. A peeked message
// holds no lease: its Ack, Fail, Retry, DeadLetter and ExtendLease return
// ErrUnknownMessage, and its Group, LeaseID and Attempt are zero.
//
// A queue that was never pushed to reads as empty, as for Pop. A message
// that cannot be decoded (a corrupt segment, a payload the client's keys do
// not open) fails the whole Peek with an error wrapping ErrEncryption or
// describing the damage: unlike Pop, Peek moves nothing to the dead-letter
// store.
//
// Peek is meant for tests, tools and debugging; it reads every retained
// segment from o.From on, and without a Partition it sorts the queue's
// segments, so keep Limit small on large queues.
func (q *Queue) Peek(ctx context.Context, o PeekOptions) ([]*Message, error) {
	e := q.c.e
	if e.isClosed() {
		return nil, ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return nil, err
	}
	if err := checkName(namePartition, o.Partition); err != nil {
		return nil, err
	}
	if o.From < 0 || o.Limit < 0 {
		return nil, fmt.Errorf("queen: PeekOptions: From and Limit must not be negative")
	}
	if o.Limit == 0 {
		o.Limit = DefaultPeekLimit
	}
	if o.Limit > MaxBatch {
		return nil, fmt.Errorf("queen: PeekOptions.Limit %d exceeds MaxBatch (%d)", o.Limit, MaxBatch)
	}
	// As Pop: say why at once rather than fail on the first message.
	if err := q.refuseWithoutKey(ctx); err != nil {
		return nil, err
	}
	var part *string
	if o.Partition != "" {
		part = &o.Partition
	}
	var (
		out   []*Message
		raw   []byte
		arena decodeArena
		bad   error // a segment that does not decode: ends the peek
	)
	err := stmt.Peek(ctx, e.csql, e.pool, stmt.PeekParams{
		Queue: stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, Partition: part, From: o.From, Limit: o.Limit,
	}, func(r *stmt.PeekRow) (bool, error) {
		pname, base, end, lo := r.PartitionName, r.Base, r.End, r.First
		var err error
		if raw, err = segment.Decompress(raw[:0], r.Blob); err != nil {
			bad = fmt.Errorf("queen: peek %q: partition %q segment %d-%d: %w", q.name, pname, base, end, err)
			return false, nil
		}
		hi := min(end, lo+int64(o.Limit-len(out))-1)
		arena.last = hi
		_, err = q.decodeRun(&arena, pname, raw, base, end, lo, hi, nil, func(off int64) *Message {
			return &Message{Queue: q.name, Partition: pname, Offset: off, CreatedAt: r.CreatedAt}
		}, func(m *Message, openErr error) error {
			if openErr != nil {
				return fmt.Errorf("offset %d: %w", m.Offset, openErr)
			}
			out = append(out, m)
			return nil
		})
		if err != nil {
			bad = fmt.Errorf("queen: peek %q: partition %q: %w", q.name, pname, err)
			return false, nil
		}
		return len(out) < o.Limit, nil
	})
	if bad != nil {
		return nil, bad
	}
	if err != nil {
		if e.isClosed() {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("queen: peek %q: %w", q.name, err)
	}
	return out, nil
}
