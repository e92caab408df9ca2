// Package settings caches the queue settings a push needs (encryption,
// lane count, dedup window), per client. It owns the reads' goroutines and
// reaches the database only through the Reader it is given; it also keeps
// whether the database answered a moment ago, which the push path asks
// before waiting on it.
package settings

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Meta is what the push handler needs to know about a queue.
type Meta struct {
	Encryption bool
	Lanes      int32     // the queue's lane count; the default for a queue not created yet
	Dedup      bool      // the queue has a dedup window
	ID         int64     // the queue's id; 0 for a queue not created yet
	Fetched    time.Time // when it was read from the database; zero: never
}

// TTL bounds how long another process's Configure can go unseen. The
// database still rejects a plaintext segment for an encrypted queue, so a
// stale entry costs a retry, never a plaintext write.
const TTL = 5 * time.Second

// DefaultMax is the default bound on cached settings. Past it the least
// recently used quarter is dropped (a dropped queue costs one read on its
// next push, or, while the database is away, the knowledge of its
// setting). An entry is a few hundred bytes at most.
const DefaultMax = 1 << 14

// DownFor is how long after the database failed to answer (a settings
// read, or a bundle's connection) a missing setting is reported unknown and
// a bundle fails at once: during an outage each push would otherwise wait up
// to StatementTimeout for its own attempt, and a push queued behind a
// partition's flush in flight for as long again. Reads go on in the
// background meanwhile, and any answer ends it.
const DownFor = time.Second

// Reader reads a queue's settings from the database (Fetched need not be
// set). A queue not created yet is no error: its settings are those its
// first push creates it with.
type Reader func(ctx context.Context, tenant uuid.UUID, name string) (Meta, error)

type key struct {
	tenant uuid.UUID
	name   string
}

// Cache memoises queue settings per client. An entry older than TTL is
// refreshed in the background while it keeps serving: it is the best
// knowledge there is when the database cannot answer, and a push must not
// wait on the database for it.
type Cache struct {
	ctx     context.Context // the engine's: reads run on it, never a caller's
	timeout time.Duration
	read    Reader
	max     int

	mu    sync.RWMutex
	m     map[key]*entry
	reads map[key]*pending // in flight, one per key
	// gen counts forgets: a read that started before one must not store
	// the setting it was told to drop.
	gen uint64
	// downUntil is DownFor after the database last failed to answer,
	// lastErr its error.
	downUntil time.Time
	lastErr   error
}

// New returns a cache whose reads run on ctx, each within timeout, and
// which holds at most max entries (DefaultMax if max < 1).
func New(ctx context.Context, timeout time.Duration, read Reader, max int) *Cache {
	if max < 1 {
		max = DefaultMax
	}
	return &Cache{ctx: ctx, timeout: timeout, read: read, max: max}
}

// entry is replaced, never changed, except for used.
type entry struct {
	meta Meta
	used atomic.Int64 // unix nanoseconds of the last lookup, to a millisecond
}

// lookup returns k's entry and marks it used.
func (c *Cache) lookup(k key) (Meta, bool) {
	c.mu.RLock()
	ent := c.m[k]
	c.mu.RUnlock()
	if ent == nil {
		return Meta{}, false
	}
	// Written at most once a millisecond, so concurrent pushes to one
	// queue do not all write the same cache line.
	if now := time.Now().UnixNano(); now-ent.used.Load() > int64(time.Millisecond) {
		ent.used.Store(now)
	}
	return ent.meta, true
}

// storeLocked caches m for k, evicting first if the cache is full.
func (c *Cache) storeLocked(k key, m Meta) {
	if c.m == nil {
		c.m = make(map[key]*entry)
	}
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		c.evictLocked()
	}
	ent := &entry{meta: m}
	ent.used.Store(time.Now().UnixNano())
	c.m[k] = ent
}

// evictLocked drops the least recently used quarter of the entries (at
// least enough to make room for one), so its O(n log n) is paid once per
// n/4 insertions.
func (c *Cache) evictLocked() {
	type use struct {
		k    key
		used int64
	}
	all := make([]use, 0, len(c.m))
	for k, ent := range c.m {
		all = append(all, use{k, ent.used.Load()})
	}
	slices.SortFunc(all, func(a, b use) int { return cmp.Compare(a.used, b.used) })
	n := max(len(all)/4, len(all)-c.max+1)
	for _, u := range all[:n] {
		delete(c.m, u.k)
	}
}

// pending is one read of a queue's settings, shared by everyone who needs
// them meanwhile. m and err are set before done is closed.
type pending struct {
	done chan struct{}
	m    Meta
	err  error
}

// NoteDown records that the database did not answer.
func (c *Cache) NoteDown(err error) {
	c.mu.Lock()
	c.downUntil, c.lastErr = time.Now().Add(DownFor), err
	c.mu.Unlock()
}

// NoteUp records that the database answered.
func (c *Cache) NoteUp() {
	c.mu.Lock()
	c.downUntil = time.Time{}
	c.mu.Unlock()
}

// DownErr is the database's last failure to answer if it was less than
// DownFor ago, else nil.
func (c *Cache) DownErr() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if time.Now().Before(c.downUntil) {
		return fmt.Errorf("the database did not answer a moment ago: %w", c.lastErr)
	}
	return nil
}

// Get returns the queue's settings. An error means they are unknown: the
// database could not be asked or did not answer within the timeout (or ctx
// ended first). The read itself runs on the cache's context, never the
// caller's, so a caller giving up does not kill the connection, and it is
// shared by everyone asking meanwhile.
//
// A fresh entry serves; a stale one serves while it is refreshed in the
// background; a missing one is read, unless the database failed to answer
// a moment ago.
func (c *Cache) Get(ctx context.Context, tenant uuid.UUID, name string) (Meta, error) {
	k := key{tenant, name}
	m, ok := c.lookup(k)
	if ok && time.Since(m.Fetched) < TTL {
		return m, nil
	}
	r := c.start(k)
	if ok {
		return m, nil // the refresh lands in the cache
	}
	if err := c.DownErr(); err != nil {
		return m, fmt.Errorf("queen: read queue %q: %w", name, err)
	}
	select {
	case <-r.done:
		return r.m, r.err
	case <-ctx.Done():
		return m, ctx.Err()
	}
}

// start starts a read of k's settings, or joins the one in flight.
func (c *Cache) start(k key) *pending {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.reads[k]; r != nil {
		return r
	}
	if c.reads == nil {
		c.reads = make(map[key]*pending)
	}
	r := &pending{done: make(chan struct{})}
	c.reads[k] = r
	gen := c.gen
	go func() {
		ctx, cancel := context.WithTimeout(c.ctx, c.timeout)
		m, err := c.read(ctx, k.tenant, k.name)
		cancel()
		if err != nil {
			r.err = fmt.Errorf("queen: read queue %q: %w", k.name, err)
		} else {
			m.Fetched = time.Now()
			r.m = m
		}
		c.mu.Lock()
		if c.reads[k] == r {
			delete(c.reads, k)
		}
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			c.downUntil = time.Time{}
		case !errors.As(err, &pgErr) && c.ctx.Err() == nil:
			// No answer at all, rather than an error from the server.
			c.downUntil, c.lastErr = time.Now().Add(DownFor), r.err
		}
		if err == nil && c.gen == gen {
			c.storeLocked(k, r.m)
		}
		c.mu.Unlock()
		close(r.done)
	}()
	return r
}

// Forget drops the queue's settings; a read in flight does not store them.
func (c *Cache) Forget(tenant uuid.UUID, name string) {
	c.mu.Lock()
	k := key{tenant, name}
	delete(c.m, k)
	delete(c.reads, k) // later callers must not join a read from before
	c.gen++
	c.mu.Unlock()
}

// Peek returns the queue's cached settings without waiting on the
// database: a stale entry serves while it is refreshed in the background,
// as in Get; a missing one is not read (ok false).
func (c *Cache) Peek(tenant uuid.UUID, name string) (m Meta, ok bool) {
	k := key{tenant, name}
	if m, ok = c.lookup(k); ok && time.Since(m.Fetched) >= TTL {
		c.start(k)
	}
	return m, ok
}

// Refresh reads the queue's settings again in the background (or joins the
// read in flight), the cached entry serving meanwhile: for a caller that
// knows the queue changed, such as its first push creating it.
func (c *Cache) Refresh(tenant uuid.UUID, name string) { c.start(key{tenant, name}) }

// Len is the number of cached settings.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// Cached reports whether the queue's settings are cached.
func (c *Cache) Cached(tenant uuid.UUID, name string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.m[key{tenant, name}]
	return ok
}

// Expire makes every entry look older than TTL and forgets that a read
// failed recently, as if the cache had not been used for a while (tests).
func (c *Cache) Expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, ent := range c.m {
		m := ent.meta
		m.Fetched = time.Time{}
		c.m[k] = &entry{meta: m}
	}
	c.downUntil = time.Time{}
}
