package queen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/settings"
	"github.com/e03140bc/queen/internal/stmt"
)

// Queue is a cheap handle on one queue of the client's tenant. Creating it
// touches nothing; the queue is created by Configure or by its first push.
type Queue struct {
	c    *Client
	name string
}

// Queue returns a handle on the named queue. Names are 1-255 bytes of UTF-8
// without control characters; an invalid name fails on first use with
// ErrInvalidName.
func (c *Client) Queue(name string) *Queue { return &Queue{c: c, name: name} }

// Name is the queue's name.
func (q *Queue) Name() string { return q.name }

// QueueOptions are a queue's settings. Zero fields take the default written
// next to them, so Configure(ctx, QueueOptions{}) and a first push create
// the same queue.
type QueueOptions struct {
	// LeaseTime is how long a popped batch is owned before redelivery. It
	// is stored in whole milliseconds: under 1ms is an error. Defaults to
	// DefaultLeaseTime (5 minutes).
	LeaseTime time.Duration
	// RetryLimit is how many explicit failures a message may have: its
	// RetryLimit-th failure dead-letters it (or drops it), so with 3 it is
	// handled at most three times before that (expired leases are not
	// failures). Defaults to DefaultRetryLimit (3); negative means none (the first failure is
	// final).
	RetryLimit int
	// RetryBackoff is how long a failed message waits before its next
	// attempt (see RetryBackoff for the schedule): exponential with
	// jitter between Min and Max. Under FailurePause the partition waits
	// with it; under FailureSkip only the failed message waits, aside,
	// and its copy is appended at the partition's tail when the wait is
	// over (QueueStatus.RetriesWaiting counts them). In a Consume with
	// KeyConcurrency > 1 under FailurePause the failed message and its
	// key's later messages wait, and the partition's other keys go on.
	// Defaults to
	// RetryBackoff{Min: DefaultRetryBackoffMin, Max:
	// DefaultRetryBackoffMax}.
	RetryBackoff RetryBackoff
	// DeadLetter keeps exhausted messages in the dead-letter store; else they
	// are dropped. Defaults to false.
	DeadLetter bool
	// DedupWindow is the producer idempotency window on TransactionID: a
	// push repeating a transaction id stored less than this long ago is a
	// Duplicate. Defaults to 0: off (only duplicates inside one flush are
	// caught).
	DedupWindow time.Duration
	// Encryption stores payloads AES-256-GCM encrypted with
	// Config.EncryptionKey. Defaults to false.
	Encryption bool
	// DelayedProcessing makes a message visible this long after its push.
	// Defaults to 0.
	DelayedProcessing time.Duration
	// WindowBuffer holds a partition back until its newest message is this
	// old. Defaults to 0.
	WindowBuffer time.Duration
	// Retention deletes messages older than this, consumed or not. Defaults
	// to 0: keep.
	Retention time.Duration
	// CompletedRetention deletes messages older than this once every group
	// subscribed to the queue (queue mode included) has consumed them; a
	// group owes nothing its subscription does not deliver. Defaults to 0:
	// keep.
	CompletedRetention time.Duration
	// FailurePolicy is what a failed message (Message.Fail, a Consume
	// handler's error) does to the later messages of its partition.
	// Defaults to FailurePause: strict order per key.
	FailurePolicy FailurePolicy
	// Lanes is the number of keyed lanes: an Item with a Key and no
	// Partition goes to partition "lane-<i>" with
	//
	//	i = XXH3_64bits(key) mod Lanes
	//
	// the 64-bit XXH3 hash (seed 0, no secret) of the key's UTF-8 bytes, as
	// an unsigned integer, and <i> in decimal without leading zeros; so
	// "lane-0" through "lane-<Lanes-1>". A producer in another language
	// routes the same way with its XXH3 library. Negative is an error.
	// Once the queue has stored a message with a Key the count is fixed:
	// Configure with another one fails with ErrLanesFixed (so a Configure
	// of such a queue must repeat its Lanes, as for every other option).
	// Defaults to DefaultLanes (64).
	Lanes int
	// DeadLetterRetention deletes the queue's dead letters once they are
	// this old (DeadLetter.DeadAt): the maintenance pass removes them,
	// StepRows at a time. Defaults to 0: keep them until they are
	// requeued, discarded or the queue is deleted.
	DeadLetterRetention time.Duration
}

// FailurePolicy decides whether a failed message holds up its partition.
// Retry, DeadLetter and lease expiry are the same under both policies: a
// retried or expired message is redelivered in place, a dead letter moves
// the cursor past it.
type FailurePolicy string

const (
	// FailurePause redelivers a failed message in place: later messages of
	// its partition wait until it is acked or, once RetryLimit failures are
	// spent, dead-lettered (or dropped). Order per key is strict. This is the
	// default, because a partition is an ordered lane: it is what Kafka
	// users get from retrying in place and what the queue's partitions have
	// always done, and RetryLimit bounds the pause.
	FailurePause FailurePolicy = "pause"
	// FailureSkip moves a failed message out of the way: it is re-enqueued
	// at its partition's tail as a new offset (same ID, TransactionID and
	// payload, its failure count carried along so RetryLimit still applies
	// and Message.Attempt keeps counting) once its RetryBackoff (or the
	// RetryAfter it failed with) has passed, and the later messages go on
	// at once; at the limit it is dead-lettered (or dropped).
	// At-least-once; order per key is not kept after a failure. Like a job
	// queue (River) with retries.
	FailureSkip FailurePolicy = "skip"
)

func (o QueueOptions) withDefaults() (_ QueueOptions, err error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"LeaseTime", o.LeaseTime}, {"DedupWindow", o.DedupWindow}, {"DelayedProcessing", o.DelayedProcessing},
		{"WindowBuffer", o.WindowBuffer}, {"Retention", o.Retention}, {"CompletedRetention", o.CompletedRetention},
		{"DeadLetterRetention", o.DeadLetterRetention}} {
		if d.v < 0 {
			return o, fmt.Errorf("queen: QueueOptions.%s must not be negative", d.name)
		}
	}
	if o.LeaseTime == 0 {
		o.LeaseTime = DefaultLeaseTime
	}
	if o.LeaseTime < time.Millisecond {
		// Stored in milliseconds, it would be 0: a lease over when it starts,
		// so every pop takes the partition and no ack applies.
		return o, fmt.Errorf("queen: QueueOptions.LeaseTime %s is under the 1ms minimum", o.LeaseTime)
	}
	switch {
	case o.Lanes < 0:
		return o, fmt.Errorf("queen: QueueOptions.Lanes must not be negative (got %d)", o.Lanes)
	case o.Lanes == 0:
		o.Lanes = DefaultLanes
	case o.Lanes > math.MaxInt32:
		return o, fmt.Errorf("queen: QueueOptions.Lanes %d is over %d", o.Lanes, math.MaxInt32)
	}
	switch o.FailurePolicy {
	case "":
		o.FailurePolicy = FailurePause
	case FailurePause, FailureSkip:
	default:
		return o, fmt.Errorf("queen: QueueOptions.FailurePolicy %q is neither %q nor %q", o.FailurePolicy, FailurePause, FailureSkip)
	}
	if o.RetryBackoff, err = o.RetryBackoff.withDefaults(); err != nil {
		return o, err
	}
	switch {
	case o.RetryLimit == 0:
		o.RetryLimit = DefaultRetryLimit
	case o.RetryLimit < 0:
		o.RetryLimit = 0
	}
	return o, nil
}

// Configure creates the queue or updates its options.
func (q *Queue) Configure(ctx context.Context, o QueueOptions) error {
	e := q.c.e
	if e.isClosed() {
		return ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return err
	}
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	applied, err := stmt.QueueUpsert(ctx, e.sql, e.pool, stmt.QueueUpsertParams{
		Queue: stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, Lease: o.LeaseTime, RetryLimit: o.RetryLimit,
		DeadLetter: o.DeadLetter, DedupWindow: o.DedupWindow, Encryption: o.Encryption, Delayed: o.DelayedProcessing,
		WindowBuffer: o.WindowBuffer, Retention: o.Retention, CompletedRetention: o.CompletedRetention,
		FailurePolicy: string(o.FailurePolicy), Lanes: int32(o.Lanes), DeadLetterRetention: o.DeadLetterRetention,
		RetryBackoffMin: o.RetryBackoff.Min, RetryBackoffMax: o.RetryBackoff.Max,
	})
	e.forgetMeta(q.c.tenant, q.name)
	if err == nil && !applied {
		return fmt.Errorf("%w: queue %q has keyed messages; Lanes %d is not its lane count", ErrLanesFixed, q.name, o.Lanes)
	}
	if err != nil {
		return fmt.Errorf("queen: configure %q: %w", q.name, err)
	}
	return nil
}

// Delete removes the queue with all its partitions, messages, cursors,
// subscriptions and dead letters. It waits for pushes in flight to the
// queue, whose messages go with it; a push committing after it recreates
// the queue afresh (default options, offsets from 0, no groups).
func (q *Queue) Delete(ctx context.Context) error {
	e := q.c.e
	if e.isClosed() {
		return ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return err
	}
	err := e.onLayout(ctx, func() error {
		return stmt.QueueDelete(ctx, e.sql, e.pool, stmt.QueueRef{Tenant: q.c.tenant, Name: q.name})
	})
	e.forgetMeta(q.c.tenant, q.name)
	if err != nil {
		return fmt.Errorf("queen: delete %q: %w", q.name, err)
	}
	return nil
}

// queueMeta is what the push handler needs to know about a queue.
type queueMeta = settings.Meta

type metaKey struct {
	tenant uuid.UUID
	name   string
}

// metaTTL bounds how long another process's Configure can go unseen.
const metaTTL = settings.TTL

// noteDown records that the database did not answer.
func (e *engine) noteDown(err error) { e.meta.NoteDown(err) }

// noteUp records that the database answered.
func (e *engine) noteUp() { e.meta.NoteUp() }

// downErr is the database's last failure to answer if it was less than
// settings.DownFor ago, else nil.
func (e *engine) downErr() error { return e.meta.DownErr() }

// queueMeta returns the queue's push options (see settings.Cache.Get).
func (e *engine) queueMeta(ctx context.Context, tenant uuid.UUID, name string) (queueMeta, error) {
	return e.meta.Get(ctx, tenant, name)
}

// readQueueMeta is the settings cache's Reader.
func (e *engine) readQueueMeta(ctx context.Context, tenant uuid.UUID, name string) (queueMeta, error) {
	r := stmt.QueueMetaRow{Lanes: DefaultLanes}
	err := stmt.QueueMeta(ctx, e.sql, e.pool, stmt.QueueRef{Tenant: tenant, Name: name}, &r)
	if errors.Is(err, pgx.ErrNoRows) {
		// Not created yet: its first push creates it unencrypted, with
		// the default lanes.
		return queueMeta{Lanes: DefaultLanes}, nil
	}
	return queueMeta{Encryption: r.Encryption, Lanes: r.Lanes, Dedup: r.Dedup, ID: r.ID}, err
}

func (e *engine) forgetMeta(tenant uuid.UUID, name string) {
	e.meta.Forget(tenant, name)
	e.keyed.Delete(metaKey{tenant, name})
}
