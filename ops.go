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
}

// Queues lists every queue of the client's tenant, sorted by name, with its
// options, partition count, depth, oldest unconsumed message and groups.
// It is one statement that reads every partition of the tenant's queues:
// meant for operators and dashboards, not hot paths.
func (c *Client) Queues(ctx context.Context) ([]QueueInfo, error) {
	e := c.e
	if e.isClosed() {
		return nil, ErrClosed
	}
	rows, err := e.pool.Query(ctx, e.csql.Queues, c.tenant)
	if err != nil {
		return nil, fmt.Errorf("queen: queues: %w", err)
	}
	defer rows.Close()
	var out []QueueInfo
	for rows.Next() {
		var (
			qi                                                   QueueInfo
			leaseMs, dedupMs, delayMs, windowMs, retMs, compRtMs int64
			retry, lanes                                         int32
			policy                                               string
			parts                                                int64
			oldest                                               *time.Time
			group                                                *string
			lag                                                  *int64
			head                                                 *time.Time
			paused                                               bool
			now                                                  time.Time
		)
		if err := rows.Scan(&qi.Name, &qi.Tenant, &leaseMs, &retry, &qi.Options.DeadLetter, &dedupMs, &qi.Options.Encryption,
			&delayMs, &windowMs, &retMs, &compRtMs, &policy, &lanes, &parts, &qi.Depth, &oldest,
			&qi.Pushed, &qi.DeadLetters, &group, &lag, &head, &paused, &now, &qi.LastDeadLetterID); err != nil {
			return nil, fmt.Errorf("queen: queues: %w", err)
		}
		if n := len(out); n == 0 || out[n-1].Name != qi.Name {
			ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
			qi.Options.LeaseTime, qi.Options.DedupWindow = ms(leaseMs), ms(dedupMs)
			qi.Options.DelayedProcessing, qi.Options.WindowBuffer = ms(delayMs), ms(windowMs)
			qi.Options.Retention, qi.Options.CompletedRetention = ms(retMs), ms(compRtMs)
			qi.Options.RetryLimit = int(retry)
			if retry == 0 {
				qi.Options.RetryLimit = -1 // stored 0 is "none"; 0 in QueueOptions means the default
			}
			qi.Options.FailurePolicy, qi.Options.Lanes = FailurePolicy(policy), int(lanes)
			qi.Partitions = int(parts)
			if qi.Depth > 0 && oldest != nil {
				qi.OldestAge = max(now.Sub(*oldest), 0)
			}
			out = append(out, qi)
		}
		if group == nil {
			continue
		}
		g := QueueGroupInfo{Group: *group, Paused: paused}
		if lag != nil {
			g.Lag = *lag
		}
		if g.Lag > 0 && head != nil {
			g.LagAge = max(now.Sub(*head), 0)
		}
		last := &out[len(out)-1]
		last.Groups = append(last.Groups, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("queen: queues: %w", err)
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
	if _, err := e.pool.Exec(ctx, e.csql.Pause, q.c.tenant, q.name, group); err != nil {
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
	rows, err := e.pool.Query(ctx, e.csql.Resume, q.c.tenant, q.name, group)
	if err != nil {
		return fmt.Errorf("queen: resume %q group %q: %w", q.name, group, err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("queen: resume %q group %q: %w", q.name, group, err)
	}
	if n > 0 {
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
	if e.isClosed() {
		return 0, ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return 0, err
	}
	if err := o.checkFilters(); err != nil {
		return 0, err
	}
	if err := o.check(); err != nil {
		return 0, err
	}
	o.Limit = o.limit()
	var qid int64
	var enc bool
	if err := e.pool.QueryRow(ctx, e.csql.QueueIDEnc, q.c.tenant, q.name).Scan(&qid, &enc); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, nil
		}
		return 0, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
	}
	part, since, until, maxID := o.filters()
	rows, err := e.pool.Query(ctx, e.csql.RequeueCandidates, stmt.Args(e.csql.RequeueCandidates, q.c.tenant, q.name,
		o.Groups, part, since, until, o.After, o.Limit, enc, o.IDs, maxID)...)
	if err != nil {
		return 0, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
	}
	var (
		ids      []int64
		hashes   [][]byte
		payloads [][]byte // what a sealed dead letter's replace (the previous release's arguments)
		flags    []*int32
		blobs    [][]byte
	)
	for rows.Next() {
		var (
			id      int64
			txn     string
			reseal  bool
			payload []byte
			pname   string
			mid     uuid.UUID
			key     string
			hdrs    []byte
			fl      int32
		)
		if err := rows.Scan(&id, &txn, &reseal, &payload, &pname, &mid, &key, &hdrs, &fl); err != nil {
			rows.Close()
			return 0, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
		}
		var newPay []byte
		var newFl *int32
		if reseal {
			if !e.keys.CanSeal() {
				rows.Close()
				return 0, fmt.Errorf("%w: dead letter %d of encrypted queue %q is plaintext and the client has no EncryptionKey to seal it",
					ErrEncryption, id, q.name)
			}
			payload, fl = e.keys.Seal(q.c.tenant, q.name, pname, key, hdrs, mid, payload), fl|int32(frame.FlagEncrypted)
			newPay, newFl = payload, &fl
		}
		h := dedup.Sum(txn)
		// The copy's frame: the dead letter's, with the payload as stored
		// (or as sealed just now).
		blob := segment.Single(&frame.Frame{ID: mid, Flags: byte(fl), TransactionID: txn, Key: key, Headers: hdrs,
			Payload: payload})
		ids, hashes, blobs = append(ids, id), append(hashes, h[:]), append(blobs, blob)
		payloads, flags = append(payloads, newPay), append(flags, newFl)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	rows, err = e.pool.Query(ctx, e.csql.Requeue, stmt.Args(e.csql.Requeue, qid, ids, hashes, payloads, flags, blobs)...)
	if err != nil {
		return 0, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
	}
	total := 0
	var woken []string
	for rows.Next() {
		var pname string
		var n int32
		if err := rows.Scan(&pname, &n); err != nil {
			rows.Close()
			return total, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
		}
		total += int(n)
		woken = append(woken, pname)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("queen: requeue dead letters of %q: %w", q.name, err)
	}
	// After Close: the statement's implicit transaction has committed.
	for _, p := range woken {
		e.wake.Pushed(q.c.tenant, q.name, p)
	}
	return total, nil
}
