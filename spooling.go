package queen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/zeebo/xxh3"

	"github.com/e03140bc/queen/dedup"
	"github.com/e03140bc/queen/fusion"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/stmt"
	"github.com/e03140bc/queen/internal/wake"
	"github.com/e03140bc/queen/spool"
)

// The disk spool takes what PostgreSQL could not: pushes whose bundle failed
// (reported Buffered instead of Failed), every push while maintenance mode
// is on, what Close could not flush, and later pushes to a partition that
// still has spooled items (so they queue behind them). A drain loop replays
// it through the normal push path, in order per partition, and confirms
// each partition's records durably as soon as they are stored, so a
// Buffered item is stored once. The one exception is a crash between a
// replayed group's commit and its confirmation (or a statement timeout
// racing with the commit): that group is pushed again, and the queue's
// DedupWindow on the preserved transaction id absorbs it.

// spoolSlots bounds the directories tried when others are locked: each
// process needs its own, and a restarted process takes a free slot and
// drains what a previous run left in it.
const spoolSlots = 64

// defaultSpoolDir is per user, schema and database, so two databases with
// the same schema name never replay into each other, and two users never
// share one. It lives in the shared temporary directory: spool.Open refuses
// it unless this user owns it and nobody else can write to it.
func defaultSpoolDir(schema string, pool *pgxpool.Pool) string {
	cc := pool.Config().ConnConfig
	id := fmt.Sprintf("%s:%d/%s", cc.Host, cc.Port, cc.Database)
	user := ""
	if uid := os.Geteuid(); uid >= 0 {
		user = fmt.Sprintf("%d-", uid)
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("queen-spool-%s%s-%08x", user, schema, uint32(xxh3.HashString(id))))
}

func openSpool(e *engine) (*spool.Spool, error) {
	dir := e.cfg.SpoolDir
	if dir == "" {
		dir = defaultSpoolDir(e.cfg.Schema, e.pool)
	}
	for i := range spoolSlots {
		d := dir
		if i > 0 {
			d = fmt.Sprintf("%s.%d", dir, i)
		}
		sp, err := spool.Open(spool.Options{Dir: d, Logger: e.log})
		if errors.Is(err, spool.ErrLocked) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("queen: open spool %s: %w", d, err)
		}
		return sp, nil
	}
	return nil, fmt.Errorf("queen: open spool: all %d slots of %s are in use", spoolSlots, dir)
}

// spoolItems writes items to the spool and reports them Buffered; if the
// spool fails too they are Failed with both causes. Items from the drain
// itself are never re-spooled: they fail, and the drain retries them. A
// keyed item goes behind its key's records spooled under another lane
// count (see keysBehind).
func (e *engine) spoolItems(items []*pushItem, key partitionKey, cause error) {
	e.spoolGroups([]spoolGroup{{items: items, key: key, cause: cause}})
}

// spoolGroup is one partition's items to spool. placed says keysBehind
// already ran on them.
type spoolGroup struct {
	items  []*pushItem
	key    partitionKey
	cause  error
	placed bool
}

// spoolGroups is spoolItems for many partitions in one spool write (one
// fsync), not one each: a push or bundle over many partitions is Buffered
// within about StatementTimeout even when a write is slow. A group whose
// keys could go behind records routed with another lane count in the groups
// before it waits for their write, as when spooled one by one.
func (e *engine) spoolGroups(gs []spoolGroup) {
	var acc []spoolGroup
	routed := map[metaKey]int32{} // lane count of acc's routed keys; -1: several
	for _, g := range gs {
		if !g.placed && laneConflict(routed, g) {
			e.spoolRecordGroups(acc)
			acc = acc[:0]
			clear(routed)
		}
		add := func(g spoolGroup) {
			acc = append(acc, g)
			for _, it := range g.items {
				if it.lanes == 0 || it.Key == "" {
					continue
				}
				k := metaKey{g.key.Tenant, g.key.Queue}
				if n, ok := routed[k]; ok && n != it.lanes {
					routed[k] = -1
				} else if !ok {
					routed[k] = it.lanes
				}
			}
		}
		if g.placed {
			add(g)
			continue
		}
		items, held := e.keysBehind(g.key.Tenant, g.key.Queue, g.items)
		if len(items) > 0 {
			add(spoolGroup{items: items, key: g.key, cause: g.cause})
		}
		for part, h := range held {
			k := g.key
			k.Partition = part
			add(spoolGroup{items: h, key: k, cause: errBehindSpool})
		}
	}
	e.spoolRecordGroups(acc)
}

// laneConflict reports whether a keyed item of g was routed with a lane
// count other than that of the routed keys already gathered for its queue.
func laneConflict(routed map[metaKey]int32, g spoolGroup) bool {
	n, ok := routed[metaKey{g.key.Tenant, g.key.Queue}]
	if !ok {
		return false
	}
	for _, it := range g.items {
		if it.lanes != 0 && it.Key != "" && !it.noSpool && !it.resolved && it.lanes != n {
			return true
		}
	}
	return false
}

// keysBehind takes out of items (of one partition, in order) those routed
// to a lane whose key has records in the spool that were routed with
// another lane count, so to another lane: replayed, those are routed again
// to the lane the items are in now, and the items must not overtake them.
// Each goes to its key's spooled lane, routed with that count like them,
// and comes back in held, by partition, in order; the replay routes them
// again behind those records. An item that cannot be routed there is
// failed.
func (e *engine) keysBehind(tenant uuid.UUID, queue string, items []*pushItem) (kept []*pushItem, held map[string][]*pushItem) {
	type lane struct {
		part  string
		lanes int32
	}
	var keys map[string]lane // the keys held so far, and where
	for i, it := range items {
		if it.lanes == 0 || it.Key == "" || it.noSpool || it.resolved {
			if held != nil {
				kept = append(kept, it)
			}
			continue
		}
		to, ok := keys[it.Key]
		if !ok {
			part, n, found := e.spool.PendingRouted(tenant, queue, func(n uint32) string {
				if n == 0 || n > math.MaxInt32 {
					return ""
				}
				return laneOf(it.Key, int32(n))
			})
			if found && part != it.res.Partition {
				to, ok = lane{part, int32(n)}, true
				if keys == nil {
					keys = make(map[string]lane)
				}
				keys[it.Key] = to
			}
		}
		if !ok {
			if held != nil {
				kept = append(kept, it)
			}
			continue
		}
		if held == nil {
			held = make(map[string][]*pushItem)
			kept = append(items[:0:0], items[:i]...)
		}
		if len(e.route(tenant, queue, []*pushItem{it}, to.lanes)) == 1 {
			held[to.part] = append(held[to.part], it)
		}
	}
	if held == nil {
		return items, nil
	}
	return kept, held
}

// spoolRecordGroups writes the groups' items, each staying in its group's
// partition, in one spool write. If the spool refuses the write whole
// (full, or a record too large), each group tries alone, as before.
func (e *engine) spoolRecordGroups(gs []spoolGroup) {
	type part struct {
		keep  []*pushItem
		recs  []spool.Record
		cause error
	}
	var parts []part
	n := 0
	for _, g := range gs {
		// Every way into the spool seals here: maintenance, an outage, a
		// failed bundle, a partition queued behind its spooled items.
		e.sealForSpool(g.key, g.items)
		p := part{cause: g.cause}
		for _, it := range g.items {
			if it.noSpool {
				resolveFailed(it, g.cause)
				continue
			}
			p.keep = append(p.keep, it)
			p.recs = append(p.recs, spoolRecord(g.key, &it.Frame, it.lanes))
		}
		if len(p.recs) > 0 {
			parts = append(parts, p)
			n += len(p.recs)
		}
	}
	if n == 0 {
		return
	}
	// No deadline: an Append whose context ends mid-write may still have
	// written the records, which the drain then stores; Failed must mean
	// not stored, so wait for the write's own outcome.
	write := func(recs []spool.Record) error {
		return e.cfg.test.spoolAppend(e.spool, context.Background(), recs)
	}
	resolve := func(p part, err error) {
		for _, it := range p.keep {
			if err != nil {
				resolveFailed(it, fmt.Errorf("queen: spool write failed (%w) after: %w", err, p.cause))
			} else {
				it.resolve(PushResult{Status: Buffered, MessageID: it.ID, Offset: -1})
			}
		}
	}
	recs := parts[0].recs
	if len(parts) > 1 {
		recs = make([]spool.Record, 0, n)
		for _, p := range parts {
			recs = append(recs, p.recs...)
		}
	}
	err := write(recs)
	if err != nil && len(parts) > 1 && (errors.Is(err, spool.ErrFull) || errors.Is(err, spool.ErrTooLarge)) {
		for _, p := range parts {
			resolve(p, write(p.recs))
		}
	} else {
		for _, p := range parts {
			resolve(p, err)
		}
	}
	e.drain.kick()
}

// spoolBehind spools the groups whose partition still has items in the
// spool, and the keyed items whose key has (see keysBehind), and takes
// them out of groups: a later push must not overtake them.
func (e *engine) spoolBehind(tenant uuid.UUID, queue string, groups map[string][]*pushItem) {
	var out []spoolGroup
	for part, g := range groups {
		k := partitionKey{Tenant: tenant, Queue: queue, Partition: part}
		if e.spool.Pending(tenant, queue, part) {
			out = append(out, spoolGroup{items: g, key: k, cause: errBehindSpool})
			delete(groups, part)
			continue
		}
		kept, held := e.keysBehind(tenant, queue, g)
		if held == nil {
			continue
		}
		if len(kept) == 0 {
			delete(groups, part)
		} else {
			groups[part] = kept
		}
		for hp, hg := range held {
			k.Partition = hp
			out = append(out, spoolGroup{items: hg, key: k, cause: errBehindSpool, placed: true})
		}
	}
	if len(out) > 0 {
		e.spoolGroups(out)
	}
}

// refuseUnreplayable fails a push that could never be replayed instead of
// spooling it: in maintenance mode, a client without Config.EncryptionKey
// that has not seen the queue asks PostgreSQL (once per metaTTL, briefly)
// whether it is encrypted. If PostgreSQL cannot tell, the push is spooled;
// should it never succeed, replay quarantines that record alone.
func (e *engine) refuseUnreplayable(ctx context.Context, tenant uuid.UUID, queue string, meta queueMeta) error {
	if e.keys.CanSeal() || meta.Encryption || !meta.Fetched.IsZero() || !e.maintOn.Load() {
		return nil
	}
	d := e.drain
	k := metaKey{tenant, queue}
	d.encMu.Lock()
	c, ok := d.enc[k]
	d.encMu.Unlock()
	if !ok || time.Since(c.at) >= metaTTL {
		qctx, cancel := context.WithTimeout(ctx, min(e.cfg.StatementTimeout, time.Second))
		var m stmt.QueueMetaRow
		err := stmt.QueueMeta(qctx, e.sql, e.pool, stmt.QueueRef{Tenant: tenant, Name: queue}, &m)
		cancel()
		c.encrypted = m.Encryption
		if errors.Is(err, pgx.ErrNoRows) {
			c.encrypted, err = false, nil
		}
		if err != nil {
			return nil
		}
		c.at = time.Now()
		d.encMu.Lock()
		if d.enc == nil || len(d.enc) >= 1<<16 {
			d.enc = make(map[metaKey]encFlag)
		}
		d.enc[k] = c
		d.encMu.Unlock()
	}
	if c.encrypted {
		return errNoKey(queue)
	}
	return nil
}

type encFlag struct {
	encrypted bool
	at        time.Time
}

// drainer replays the spool in the background.
type drainer struct {
	e         *engine
	ctx       context.Context // ends when the drain stops
	cancel    context.CancelFunc
	kickCh    chan struct{}
	done      chan struct{}
	replayed  atomic.Int64
	failures  atomic.Int64
	lastDrain atomic.Int64 // unix nanos of the last pass that emptied the spool

	encMu sync.Mutex
	enc   map[metaKey]encFlag // refuseUnreplayable's answers
}

const (
	drainEvery      = time.Second // also how often the maintenance flag is re-read
	drainBackoffMax = 5 * time.Second
)

func newDrainer(e *engine) *drainer {
	d := &drainer{e: e, kickCh: make(chan struct{}, 1), done: make(chan struct{})}
	d.ctx, d.cancel = context.WithCancel(e.ctx)
	go d.run()
	return d
}

func (d *drainer) kick() {
	select {
	case d.kickCh <- struct{}{}:
	default:
	}
}

// close stops the drain: a pass in progress starts nothing new and ends
// once the groups it handed to fusion are resolved and confirmed (the
// engine's context bounds that). What it did not replay stays spooled.
func (d *drainer) close() {
	d.cancel()
	<-d.done
}

func (d *drainer) run() {
	defer close(d.done)
	e := d.e
	backoff := time.Duration(0)
	t := time.NewTimer(0) // a first pass drains what a previous run left
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		case <-d.kickCh:
			if backoff > 0 {
				continue // a failing database is retried on the backoff timer
			}
		}
		// Not a kick: this pass replays if maintenance just ended, and the
		// loop may run before Open has published the drain.
		e.refreshMaintenance(d.ctx)
		if s := e.encSet.Load(); s == nil || time.Since(s.at) >= metaTTL {
			e.refreshEncrypted(d.ctx)
		}
		wait := drainEvery
		if !e.maintOn.Load() && e.spool.Stats().PendingRecords > 0 {
			n, err := e.spool.Replay(d.ctx, d.replay)
			d.replayed.Add(int64(n))
			switch {
			case d.ctx.Err() != nil:
				return
			case err != nil:
				d.failures.Add(1)
				backoff = min(max(2*backoff, 100*time.Millisecond), drainBackoffMax)
				wait = backoffJitter(backoff)
				e.log.Warn("queen: spool drain", "replayed", n, "retry_in", backoff, "err", err)
			default:
				backoff = 0
				if e.spool.Stats().PendingRecords == 0 {
					d.lastDrain.Store(time.Now().UnixNano())
				} else {
					wait = 0 // more arrived meanwhile
				}
			}
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(wait)
	}
}

// replay pushes one partition's records through fusion with their original
// message and transaction ids, and reports how many leading records are
// stored (Queued or Duplicate). Once the group is handed to fusion it waits
// for the verdicts whatever ctx says: fusion resolves every item it takes
// (committed, or failed when the engine stops), and a commit the spool did
// not hear of would be pushed again.
func (d *drainer) replay(ctx context.Context, batch []spool.Record) (int, error) {
	e := d.e
	if len(batch) == 0 {
		return 0, nil
	}
	if e.maintOn.Load() {
		return 0, errMaintenance
	}
	err := checkName(nameQueue, batch[0].Queue)
	if err == nil {
		err = checkName(nameStoredPartition, batch[0].Partition)
	}
	if err != nil {
		return 0, spool.Permanent(fmt.Errorf("queen: spooled message %s: %w", batch[0].MessageID, err))
	}
	for i := range batch {
		// Written by this package, under a CRC: bad headers are a bug or
		// another writer, and a frame carrying them would be undecodable.
		if _, err := frame.DecodeHeaders(batch[i].Headers); err != nil {
			return 0, spool.Permanent(fmt.Errorf("queen: spooled message %s: %w", batch[i].MessageID, err))
		}
	}
	results := make([]PushResult, len(batch))
	items := make([]pushItem, len(batch))
	group := make([]*pushItem, len(batch))
	for i := range batch {
		r := &batch[i]
		it := &items[i]
		it.Frame, it.res, it.noSpool = spooledFrame(r), &results[i], true
		it.hash = dedup.Sum(r.TransactionID)
		it.lanes = int32(min(r.Lanes, math.MaxInt32))
		results[i].Partition = r.Partition
		group[i] = it
	}
	key := partitionKey{Tenant: batch[0].Tenant, Queue: batch[0].Queue, Partition: batch[0].Partition}
	done := make(chan struct{})
	if err := e.push.fusion.Submit(ctx, key, group, func() { close(done) }); err != nil {
		if err == fusion.ErrClosed {
			err = ErrClosed
		}
		return 0, err
	}
	<-done
	d.rerouteReplayed(key, items)
	for i, r := range results {
		switch r.Status {
		case Queued, Duplicate:
			continue
		}
		if errors.Is(r.Err, ErrEncryption) {
			return i, spool.Permanent(r.Err)
		}
		return i, r.Err
	}
	return len(batch), nil
}

// rerouteReplayed routes again the replayed items the database sent back
// because the lane count they were routed with is not their queue's (the
// push that spooled them had stale or unknown settings), and waits for
// them: records are confirmed only once stored, in order. What cannot be
// routed stays failed, and the drain retries the records.
func (d *drainer) rerouteReplayed(key partitionKey, items []pushItem) {
	e := d.e
	for n := 0; n < maxReroutes; n++ {
		var moved []*pushItem
		for i := range items {
			if it := &items[i]; it.takeSentBack() {
				moved = append(moved, it)
			}
		}
		if len(moved) == 0 {
			return
		}
		meta, err := e.queueMeta(d.ctx, key.Tenant, key.Queue)
		if err != nil {
			for _, it := range moved {
				resolveFailed(it, err)
			}
			return
		}
		groups := e.reroute(key.Tenant, key.Queue, moved, max(meta.Lanes, 1))
		done := make(chan struct{})
		var pending atomic.Int32
		pending.Store(int32(len(groups)) + 1)
		release := func() {
			if pending.Add(-1) == 0 {
				close(done)
			}
		}
		for part, g := range groups {
			k := partitionKey{Tenant: key.Tenant, Queue: key.Queue, Partition: part}
			// Once handed over, fusion resolves every item; Submit is not
			// bound to the drain's context for that reason.
			if err := e.push.fusion.Submit(context.WithoutCancel(d.ctx), k, g, release); err != nil {
				for _, it := range g {
					resolveFailed(it, err)
				}
				release()
			}
		}
		release()
		<-done
	}
	for i := range items {
		if it := &items[i]; it.takeSentBack() {
			resolveFailed(it, fmt.Errorf("%w: gave up after %d attempts", errLanesChanged, maxReroutes))
		}
	}
}

// SetMaintenance switches maintenance mode for every process using this
// schema. On: every push goes to the local disk spool and is reported
// Buffered, without touching PostgreSQL, and spool drains pause. Off: the
// drains replay what was spooled. Other processes follow within about a
// second (at once when their LISTEN connection is up).
func (c *Client) SetMaintenance(ctx context.Context, on bool) error {
	e := c.e
	if e.isClosed() {
		return ErrClosed
	}
	if err := stmt.SetMaintenance(ctx, e.sql, e.pool, on); err != nil {
		return fmt.Errorf("queen: set maintenance: %w", err)
	}
	e.maintMu.Lock()
	e.maintGen++ // a re-read begun before this commit must not land after it
	e.maintOn.Store(on)
	e.maintMu.Unlock()
	if err := stmt.NotifyAlone(ctx, e.sql, e.pool, wake.MaintenanceNotice); err != nil {
		e.log.Warn("queen: notify maintenance change", "err", err)
	}
	if !on {
		e.drain.kick()
	}
	return nil
}

// Maintenance reports whether maintenance mode is on, as this process last
// saw it.
func (c *Client) Maintenance() bool { return c.e.maintOn.Load() }

// refreshMaintenance re-reads the maintenance flag and reports whether
// maintenance mode just ended, which is when the drain must replay. The
// drain's own loop replays in the same pass; other callers kick it.
// Re-reads run one at a time (the drain's poll and the listener's may
// overlap), and one that began before this client's SetMaintenance
// committed is dropped: each statement has its own snapshot, so a read
// that landed late would undo a newer state.
func (e *engine) refreshMaintenance(ctx context.Context) (ended bool) {
	e.maintRead.Lock()
	defer e.maintRead.Unlock()
	e.maintMu.Lock()
	gen := e.maintGen
	e.maintMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, e.cfg.StatementTimeout)
	defer cancel()
	on, err := stmt.GetMaintenance(ctx, e.sql, e.pool)
	if err != nil {
		return false // keep the last known state while the database is away
	}
	e.maintMu.Lock()
	defer e.maintMu.Unlock()
	if e.maintGen != gen {
		return false
	}
	was := e.maintOn.Swap(on)
	return was && !on
}

// encQueueSet is the schema's encrypted queues as last read. A client
// without a key keeps it so that during an outage it can spool, in
// plaintext, a push to a queue it has not seen: one not in the set was not
// encrypted at the last contact.
type encQueueSet struct {
	m  map[metaKey]struct{}
	at time.Time
}

// refreshEncrypted reads the schema's encrypted queues, for a client
// without a key (one with a key seals whatever it spools). It keeps the last
// set while the database is away.
func (e *engine) refreshEncrypted(ctx context.Context) {
	if e.keys.CanSeal() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.StatementTimeout)
	defer cancel()
	rows, err := e.pool.Query(ctx, "SELECT tenant, name FROM "+pgx.Identifier{e.cfg.Schema, "queues"}.Sanitize()+
		" WHERE encryption")
	if err != nil {
		return
	}
	s := &encQueueSet{m: make(map[metaKey]struct{})}
	var k metaKey
	_, err = pgx.ForEachRow(rows, []any{&k.tenant, &k.name}, func() error {
		s.m[k] = struct{}{}
		return nil
	})
	if err != nil {
		return
	}
	s.at = time.Now()
	e.encSet.Store(s)
}

// lastEncrypted reports whether queue was encrypted at the last read of the
// encrypted queues; known is false when there was none.
func (e *engine) lastEncrypted(tenant uuid.UUID, queue string) (encrypted, known bool) {
	s := e.encSet.Load()
	if s == nil {
		return false, false
	}
	_, encrypted = s.m[metaKey{tenant, queue}]
	return encrypted, true
}

// spoolPush is Push in maintenance mode: straight to the spool.
func (e *engine) spoolPush(key partitionKey, b *pushBatch) {
	e.spoolGroups(groupsOf(key, b.groups, errMaintenance))
}

// groupsOf is groups, by partition of key's queue, to spool for cause.
func groupsOf(key partitionKey, groups map[string][]*pushItem, cause error) []spoolGroup {
	out := make([]spoolGroup, 0, len(groups))
	for part, g := range groups {
		k := key
		k.Partition = part
		out = append(out, spoolGroup{items: g, key: k, cause: cause})
	}
	return out
}

// SpoolStats describes the disk spool and its drain.
type SpoolStats struct {
	Dir              string
	Files            int
	PendingRecords   int64 // spooled, not yet replayed
	PendingBytes     int64
	Appended         int64 // records spooled since Open
	Replayed         int64 // records replayed since Open
	QuarantinedFiles int   // *.spool.quarantine files in Dir: records set aside (see QuarantinedRecords) or corrupt files
	// QuarantinedRecords counts records set aside on their own since Open
	// because their replay kept failing permanently (for example, their
	// queue became encrypted and this client has no key). Each is logged.
	QuarantinedRecords int64
	DrainFailures      int64 // drain passes that stopped on an error
	LastError          error
}

// SpoolStats reports the spool's depth and the drain's progress.
func (c *Client) SpoolStats() SpoolStats {
	e := c.e
	s := e.spool.Stats()
	return SpoolStats{
		Dir: e.spool.Dir(), Files: s.Files, PendingRecords: s.PendingRecords, PendingBytes: s.PendingBytes,
		Appended: s.Appended, Replayed: e.drain.replayed.Load(), QuarantinedFiles: s.QuarantinedFiles, QuarantinedRecords: s.QuarantinedRecords,
		DrainFailures: e.drain.failures.Load(), LastError: s.LastError,
	}
}

// spoolRecord is the spool's record of a stored message f bound for key,
// routed with lanes (0: not routed). With spooledFrame it is the one place
// the message as stored maps to the spool's record, whose on-disk format is
// the spool's own.
func spoolRecord(key partitionKey, f *frame.Frame, lanes int32) spool.Record {
	return spool.Record{
		Tenant: key.Tenant, Queue: key.Queue, Partition: key.Partition,
		TransactionID: f.TransactionID, MessageID: f.ID, Flags: f.Flags, Payload: f.Payload,
		Key: f.Key, Lanes: uint32(max(lanes, 0)), Headers: f.Headers,
	}
}

// spooledFrame is the stored message a spool record holds.
func spooledFrame(r *spool.Record) frame.Frame {
	return frame.Frame{ID: r.MessageID, Flags: r.Flags, TransactionID: r.TransactionID, Key: r.Key, Headers: r.Headers, Payload: r.Payload}
}
