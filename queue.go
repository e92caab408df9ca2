package queen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	// is stored in whole milliseconds: under 1ms is an error. Defaults to 5
	// minutes.
	LeaseTime time.Duration
	// RetryLimit is how many explicit failures a message may have: its
	// RetryLimit-th failure dead-letters it (or drops it), so with 3 it is
	// handled at most three times before that (expired leases are not
	// failures). Defaults to 3; negative means none (the first failure is
	// final).
	RetryLimit int
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
}

// DefaultLanes is the default of QueueOptions.Lanes.
const DefaultLanes = 64

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
	// and Message.Attempt keeps counting) and the later messages go on; at
	// the limit it is dead-lettered (or dropped). At-least-once; order per
	// key is not kept after a failure. Like a job queue (River) with retries.
	FailureSkip FailurePolicy = "skip"
)

const defaultLeaseTime = 5 * time.Minute

func (o QueueOptions) withDefaults() (QueueOptions, error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"LeaseTime", o.LeaseTime}, {"DedupWindow", o.DedupWindow}, {"DelayedProcessing", o.DelayedProcessing},
		{"WindowBuffer", o.WindowBuffer}, {"Retention", o.Retention}, {"CompletedRetention", o.CompletedRetention}} {
		if d.v < 0 {
			return o, fmt.Errorf("queen: QueueOptions.%s must not be negative", d.name)
		}
	}
	if o.LeaseTime == 0 {
		o.LeaseTime = defaultLeaseTime
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
	switch {
	case o.RetryLimit == 0:
		o.RetryLimit = 3
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
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	var one int
	err = e.pool.QueryRow(ctx, e.sql.QueueUpsert, q.c.tenant, q.name, ms(o.LeaseTime), o.RetryLimit, o.DeadLetter,
		ms(o.DedupWindow), o.Encryption, ms(o.DelayedProcessing), ms(o.WindowBuffer), ms(o.Retention), ms(o.CompletedRetention),
		string(o.FailurePolicy), int32(o.Lanes)).Scan(&one)
	e.forgetMeta(q.c.tenant, q.name)
	if errors.Is(err, pgx.ErrNoRows) {
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
	_, err := e.pool.Exec(ctx, e.sql.QueueDelete, q.c.tenant, q.name)
	e.forgetMeta(q.c.tenant, q.name)
	if err != nil {
		return fmt.Errorf("queen: delete %q: %w", q.name, err)
	}
	return nil
}

// queueMeta is what the push handler needs to know about a queue.
type queueMeta struct {
	encryption bool
	lanes      int32     // the queue's lane count; DefaultLanes for a queue not created yet
	dedup      bool      // the queue has a dedup window
	fetched    time.Time // when it was read from the database
}

type metaKey struct {
	tenant uuid.UUID
	name   string
}

// metaTTL bounds how long another process's Configure can go unseen. The
// database still rejects a plaintext segment for an encrypted queue, so a
// stale entry costs a retry, never a plaintext write.
const metaTTL = 5 * time.Second

// metaCacheMax bounds the cached settings. Past it the least recently used
// quarter is dropped (a dropped queue costs one read on its next push, or,
// while the database is away, the knowledge of its setting). An entry is a
// few hundred bytes at most. A variable so tests can lower it.
var metaCacheMax = 1 << 14

// metaCache memoises queue settings per client. An entry older than metaTTL
// is refreshed in the background while it keeps serving: it is the best
// knowledge there is when the database cannot answer, and a push must not
// wait on the database for it.
type metaCache struct {
	mu    sync.RWMutex
	m     map[metaKey]*metaEntry
	reads map[metaKey]*metaRead // in flight, one per key
	// gen counts forgets: a read that started before one must not store
	// the setting it was told to drop.
	gen uint64
	// downUntil is metaDownFor after the database last failed to answer,
	// lastErr its error.
	downUntil time.Time
	lastErr   error
}

// metaEntry is replaced, never changed, except for used.
type metaEntry struct {
	meta queueMeta
	used atomic.Int64 // unix nanoseconds of the last lookup, to a millisecond
}

// lookup returns k's entry and marks it used.
func (c *metaCache) lookup(k metaKey) (queueMeta, bool) {
	c.mu.RLock()
	ent := c.m[k]
	c.mu.RUnlock()
	if ent == nil {
		return queueMeta{}, false
	}
	// Written at most once a millisecond, so concurrent pushes to one
	// queue do not all write the same cache line.
	if now := time.Now().UnixNano(); now-ent.used.Load() > int64(time.Millisecond) {
		ent.used.Store(now)
	}
	return ent.meta, true
}

// storeLocked caches m for k, evicting first if the cache is full.
func (c *metaCache) storeLocked(k metaKey, m queueMeta) {
	if c.m == nil {
		c.m = make(map[metaKey]*metaEntry)
	}
	if _, ok := c.m[k]; !ok && len(c.m) >= metaCacheMax {
		c.evictLocked()
	}
	ent := &metaEntry{meta: m}
	ent.used.Store(time.Now().UnixNano())
	c.m[k] = ent
}

// evictLocked drops the least recently used quarter of the entries (at
// least enough to make room for one), so its O(n log n) is paid once per
// n/4 insertions.
func (c *metaCache) evictLocked() {
	type use struct {
		k    metaKey
		used int64
	}
	all := make([]use, 0, len(c.m))
	for k, ent := range c.m {
		all = append(all, use{k, ent.used.Load()})
	}
	slices.SortFunc(all, func(a, b use) int { return cmp.Compare(a.used, b.used) })
	n := max(len(all)/4, len(all)-metaCacheMax+1)
	for _, u := range all[:n] {
		delete(c.m, u.k)
	}
}

// metaRead is one read of a queue's settings, shared by everyone who needs
// them meanwhile. m and err are set before done is closed.
type metaRead struct {
	done chan struct{}
	m    queueMeta
	err  error
}

// metaDownFor is how long after the database failed to answer (a settings
// read, or a bundle's connection) a missing setting is reported unknown and
// a bundle fails at once: during an outage each push would otherwise wait up
// to StatementTimeout for its own attempt, and a push queued behind a
// partition's flush in flight for as long again. Reads go on in the
// background meanwhile, and any answer ends it.
const metaDownFor = time.Second

// noteDown records that the database did not answer.
func (e *engine) noteDown(err error) {
	e.meta.mu.Lock()
	e.meta.downUntil, e.meta.lastErr = time.Now().Add(metaDownFor), err
	e.meta.mu.Unlock()
}

// noteUp records that the database answered.
func (e *engine) noteUp() {
	e.meta.mu.Lock()
	e.meta.downUntil = time.Time{}
	e.meta.mu.Unlock()
}

// downErr is the database's last failure to answer if it was less than
// metaDownFor ago, else nil.
func (e *engine) downErr() error {
	e.meta.mu.RLock()
	defer e.meta.mu.RUnlock()
	if time.Now().Before(e.meta.downUntil) {
		return fmt.Errorf("the database did not answer a moment ago: %w", e.meta.lastErr)
	}
	return nil
}

// queueMeta returns the queue's push options. An error means they are
// unknown: the database could not be asked or did not answer within
// StatementTimeout (or ctx ended first). The read itself runs on the
// engine's context, never the caller's, so a caller giving up does not kill
// the connection, and it is shared by everyone asking meanwhile.
//
// A fresh entry serves; a stale one serves while it is refreshed in the
// background; a missing one is read, unless the database failed to answer
// a moment ago.
func (e *engine) queueMeta(ctx context.Context, tenant uuid.UUID, name string) (queueMeta, error) {
	k := metaKey{tenant, name}
	c := &e.meta
	m, ok := c.lookup(k)
	if ok && time.Since(m.fetched) < metaTTL {
		return m, nil
	}
	r := e.readMeta(k)
	if ok {
		return m, nil // the refresh lands in the cache
	}
	if err := e.downErr(); err != nil {
		return m, fmt.Errorf("queen: read queue %q: %w", name, err)
	}
	select {
	case <-r.done:
		return r.m, r.err
	case <-ctx.Done():
		return m, ctx.Err()
	}
}

// readMeta starts a read of k's settings, or joins the one in flight.
func (e *engine) readMeta(k metaKey) *metaRead {
	c := &e.meta
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.reads[k]; r != nil {
		return r
	}
	if c.reads == nil {
		c.reads = make(map[metaKey]*metaRead)
	}
	r := &metaRead{done: make(chan struct{})}
	c.reads[k] = r
	gen := c.gen
	go func() {
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.StatementTimeout)
		var enc, dedup bool
		lanes := int32(DefaultLanes)
		err := stmt.ScanRow(ctx, e.pool, e.sql.QueueMeta, []any{k.tenant, k.name}, &enc, &lanes, &dedup)
		cancel()
		if errors.Is(err, pgx.ErrNoRows) {
			// Not created yet: its first push creates it unencrypted, with
			// the default lanes.
			err, enc, lanes = nil, false, DefaultLanes
		}
		if err != nil {
			r.err = fmt.Errorf("queen: read queue %q: %w", k.name, err)
		} else {
			r.m = queueMeta{encryption: enc, lanes: lanes, dedup: dedup, fetched: time.Now()}
		}
		c.mu.Lock()
		if c.reads[k] == r {
			delete(c.reads, k)
		}
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			c.downUntil = time.Time{}
		case !errors.As(err, &pgErr) && e.ctx.Err() == nil:
			// No answer at all, rather than an error from the server.
			c.downUntil, c.lastErr = time.Now().Add(metaDownFor), r.err
		}
		if err == nil && c.gen == gen {
			c.storeLocked(k, r.m)
		}
		c.mu.Unlock()
		close(r.done)
	}()
	return r
}

func (e *engine) forgetMeta(tenant uuid.UUID, name string) {
	e.meta.mu.Lock()
	k := metaKey{tenant, name}
	delete(e.meta.m, k)
	delete(e.meta.reads, k) // later callers must not join a read from before
	e.meta.gen++
	e.meta.mu.Unlock()
	e.keyed.Delete(k)
}
