package queen

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/dedup"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/stmt"
)

// QueueInfo is one queue of a tenant as Client.Queues reports it.
type QueueInfo struct {
	Name   string
	Tenant uuid.UUID
	// Options are the stored options; Configure(ctx, Options) leaves the
	// queue as it is (a RetryLimit of none is reported as -1).
	Options    QueueOptions
	Partitions int
	// Depth is the number of unconsumed messages: per partition, the Lag
	// (as Queue.Status counts it) of the group furthest behind there,
	// summed; with no group yet, every retained message.
	Depth int64
	// OldestAge is how long the oldest message counted in Depth has
	// waited; 0 when Depth is 0.
	OldestAge time.Duration
	// Pushed is how many messages the queue's partitions were ever given
	// (retained or not): a running total, for rates.
	Pushed int64
	// DeadLetters is how many dead letters the queue holds.
	DeadLetters int64
	// LastDeadLetterID is the highest DeadLetter.ID among them; 0 for
	// none. DeadLetterQuery.MaxID set to it selects only these.
	LastDeadLetterID int64
	// Groups are the queue's consumer groups by name ("" is queue mode),
	// those subscribed and those paused before their first pop.
	Groups []QueueGroupInfo
}

// QueueGroupInfo is one consumer group of a queue, summed over its
// partitions.
type QueueGroupInfo struct {
	Group string
	// Lag is the sum of the group's Lag over the queue's partitions.
	Lag int64
	// LagAge is how long the oldest message the group has not consumed has
	// waited; 0 without lag.
	LagAge time.Duration
	// Paused reports the group paused (Queue.Pause).
	Paused bool
	// Members are the group's live members (see GroupStatus.Members).
	Members []Member
	// Abandoned reports lag and no live member to consume it.
	Abandoned bool
}

// Queues lists every queue of the client's tenant, sorted by name, with its
// options, partition count, depth, oldest unconsumed message and groups
// (with their live members). It reads every partition of the tenant's
// queues (one statement, and one for the members): meant for operators and
// dashboards, not hot paths.
func (c *Client) Queues(ctx context.Context) ([]QueueInfo, error) {
	e := c.e
	if e.isClosed() {
		return nil, ErrClosed
	}
	rows, err := stmt.Queues(ctx, e.csql, e.pool, c.tenant, e.cfg.Citus)
	if err != nil {
		return nil, fmt.Errorf("queen: queues: %w", err)
	}
	mem, err := c.liveMembers(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("queen: queues: %w", err)
	}
	var out []QueueInfo
	for _, r := range rows {
		if n := len(out); n == 0 || out[n-1].Name != r.Name {
			ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
			qi := QueueInfo{Name: r.Name, Tenant: r.Tenant, Depth: r.Depth, Pushed: r.Pushed, DeadLetters: r.DeadLetters,
				LastDeadLetterID: r.LastDeadLetter, Partitions: int(r.Partitions)}
			qi.Options.DeadLetter, qi.Options.Encryption = r.DeadLetter, r.Encryption
			qi.Options.LeaseTime, qi.Options.DedupWindow = ms(r.LeaseMs), ms(r.DedupWindowMs)
			qi.Options.DelayedProcessing, qi.Options.WindowBuffer = ms(r.DelayedMs), ms(r.WindowBufferMs)
			qi.Options.Retention, qi.Options.CompletedRetention = ms(r.RetentionMs), ms(r.CompletedRetention)
			qi.Options.RetryLimit, qi.Options.DeadLetterRetention = int(r.RetryLimit), ms(r.DeadLetterRetentionMs)
			if r.RetryLimit == 0 {
				qi.Options.RetryLimit = -1 // stored 0 is "none"; 0 in QueueOptions means the default
			}
			qi.Options.FailurePolicy, qi.Options.Lanes = FailurePolicy(r.FailurePolicy), int(r.Lanes)
			qi.Options.RetryBackoff = retryBackoffOf(r.RetryBackoffMinMs, r.RetryBackoffMaxMs)
			if qi.Depth > 0 && r.Oldest != nil {
				qi.OldestAge = max(r.Now.Sub(*r.Oldest), 0)
			}
			out = append(out, qi)
		}
		if r.Group == nil {
			continue
		}
		g := QueueGroupInfo{Group: *r.Group, Paused: r.Paused}
		if r.Lag != nil {
			g.Lag = *r.Lag
		}
		if g.Lag > 0 && r.Head != nil {
			g.LagAge = max(r.Now.Sub(*r.Head), 0)
		}
		if mem.known {
			g.Members = mem.of(r.Name, g.Group)
			g.Abandoned = g.Lag > 0 && len(g.Members) == 0
		}
		last := &out[len(out)-1]
		last.Groups = append(last.Groups, g)
	}
	return out, nil
}

// Pause stops group ("" is queue mode) from claiming anything on the
// queue, in every process, until Resume: Pop returns no messages and Consume
// idles. It is durable (a row in the database) and creates the queue if it
// does not exist. Pushes still land. Leases already held are not affected:
// their holders finish, ack, fail or extend them as usual. A group paused
// before its first pop is subscribed by that pop as usual (so SubscribeNew
// counts from it), and claims nothing. Pausing a paused group does nothing.
func (q *Queue) Pause(ctx context.Context, group string) error {
	e := q.c.e
	if err := q.checkGroup(group); err != nil {
		return err
	}
	if err := e.onLayout(ctx, func() error {
		return stmt.Pause(ctx, e.csql, e.pool, stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, group)
	}); err != nil {
		return fmt.Errorf("queen: pause %q group %q: %w", q.name, group, err)
	}
	return nil
}

// Resume undoes Pause and wakes the group's waiting consumers at once, in
// this process and (through NOTIFY) in others. Resuming a group that is not
// paused does nothing.
func (q *Queue) Resume(ctx context.Context, group string) error {
	e := q.c.e
	if err := q.checkGroup(group); err != nil {
		return err
	}
	var had bool
	err := e.onLayout(ctx, func() (err error) {
		had, err = stmt.Resume(ctx, e.csql, e.pool, stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, group)
		return err
	})
	if err != nil {
		return fmt.Errorf("queen: resume %q group %q: %w", q.name, group, err)
	}
	if had {
		e.wake.Woken(q.c.tenant, q.name)
	}
	return nil
}

func (q *Queue) checkGroup(group string) error {
	if q.c.e.isClosed() {
		return ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return err
	}
	return checkName(nameGroup, group)
}

// RequeueDeadLetters pushes the dead letters that o selects (the same
// filters and page as DeadLetters: at most o.Limit, default 100, from
// o.After on, in ID order) back to the tail of their partitions and
// deletes them from the dead-letter store, in one transaction. It returns
// how many messages it appended; call it again until that is 0 to requeue
// everything o matches. A consumer may dead-letter the copies again as
// fast as they are requeued: bound such a loop with o.MaxID.
//
// Each message keeps its ID, TransactionID, Key, Headers and stored
// payload (on an encrypted queue the ciphertext is appended as stored, no
// key needed; a plaintext dead letter of a queue encrypted since is sealed
// with Config.EncryptionKey, ErrEncryption without one). It is appended as
// a new offset, in dead-letter ID order per partition, with a fresh retry
// budget: its next delivery has Attempt 1. Like a FailureSkip re-enqueue it
// is read by every group of the queue, not only the one that dead-lettered
// it. Dead letters of one message selected together (several groups
// dead-lettered it) give one copy.
//
// The copy is never dropped as a duplicate of its original: it is not
// checked against the dedup window. It is stored with its transaction id's
// hash, so within the queue's DedupWindow a producer pushing that
// transaction id again gets Duplicate, as for any stored message.
//
// A retry after an error or a crash neither loses nor doubles: a dead
// letter is deleted in the transaction that appends it, so one that was
// requeued is no longer selected. Consumers are woken as by a push.
func (q *Queue) RequeueDeadLetters(ctx context.Context, o DeadLetterQuery) (int, error) {
	e := q.c.e
	if err := q.checkDeadLetterCall(&o); err != nil {
		return 0, err
	}
	ref := stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}
	qid, enc, err := stmt.QueueIDEnc(ctx, e.csql, e.pool, ref)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, nil
		}
		return 0, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
	}
	cands, err := stmt.RequeueCandidates(ctx, e.csql, e.pool, o.page(q), enc)
	if err != nil {
		return 0, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
	}
	if len(cands) == 0 {
		return 0, nil
	}
	in := make([]stmt.RequeueParams, 0, len(cands))
	for _, c := range cands {
		payload, fl := c.Payload, c.Flags
		p := stmt.RequeueParams{ID: c.ID}
		if c.Reseal {
			if !e.keys.CanSeal() {
				return 0, fmt.Errorf("%w: dead letter %d of encrypted queue %q is plaintext and the client has no EncryptionKey to seal it",
					ErrEncryption, c.ID, q.name)
			}
			payload, fl = e.keys.Seal(q.c.tenant, q.name, c.Partition, c.Key, c.Headers, c.MessageID, payload), fl|int32(frame.FlagEncrypted)
			p.Payload, p.Flags = payload, &fl
		}
		h := dedup.Sum(c.TransactionID)
		p.Hash = h[:]
		// The copy's frame: the dead letter's, with the payload as stored
		// (or as sealed just now).
		p.Segment = segment.Single(&frame.Frame{ID: c.MessageID, Flags: byte(fl), TransactionID: c.TransactionID,
			Key: c.Key, Headers: c.Headers, Payload: payload})
		in = append(in, p)
	}
	var rows []stmt.RequeueRow
	err = e.onLayout(ctx, func() (err error) {
		rows, err = stmt.Requeue(ctx, e.csql, e.pool, qid, in)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
	}
	total := 0
	for _, r := range rows {
		total += int(r.Requeued)
	}
	// After Close: the statement's implicit transaction has committed.
	for _, r := range rows {
		e.wake.Pushed(q.c.tenant, q.name, r.Partition)
	}
	return total, nil
}

// DiscardDeadLetters deletes the dead letters that o selects (the same
// filters and page as DeadLetters and RequeueDeadLetters: at most o.Limit,
// default 100, from o.After on, in ID order) and returns how many it
// deleted; call it again until that is 0 to discard everything o matches,
// and bound such a loop with o.MaxID (QueueInfo.LastDeadLetterID) to leave
// alone what is dead-lettered meanwhile. The page goes in one statement,
// all of it or none of it: a ctx cancelled before the call deletes
// nothing, and after an error (a ctx cancelled mid-call included) a retry
// finds whatever is left. Deleted dead letters are gone for good; nothing
// is pushed. A queue that does not exist has none: 0.
func (q *Queue) DiscardDeadLetters(ctx context.Context, o DeadLetterQuery) (int, error) {
	e := q.c.e
	if err := q.checkDeadLetterCall(&o); err != nil {
		return 0, err
	}
	var n int64
	err := e.onLayout(ctx, func() (err error) {
		n, err = stmt.DiscardDeadLetters(ctx, e.csql, e.pool, o.page(q))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("queen: discard dead letters of %q: %w", q.name, err)
	}
	return int(n), nil
}
