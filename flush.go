package queen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen/alloc"
	"github.com/e03140bc/queen/dedup"
	"github.com/e03140bc/queen/fusion"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/stmt"
	"github.com/e03140bc/queen/internal/wake"
)

// pusher owns the fusion engine and turns its bundles into push_bundle calls.
type pusher struct {
	e      *engine
	fusion *fusion.Engine[partitionKey, *pushItem]
	known  knownParts
	// cleanups are the timed-out bundles' cancel requests in flight.
	cleanups sync.WaitGroup
	// rerouted counts items routed to a lane again (a stale lane count).
	rerouted atomic.Int64

	// bundle summary, logged about every 10s
	sumMu       sync.Mutex
	sumAt       time.Time
	sumCommits  int64
	sumSegments int64
	sumItems    int64
}

func newPusher(e *engine) *pusher {
	p := &pusher{e: e, sumAt: time.Now()}
	p.fusion = fusion.New(fusion.Config{
		Shards:           e.cfg.Fusion.Shards,
		BundleMax:        e.cfg.Fusion.BundleMax,
		BundleBase:       e.cfg.Fusion.BundleBase,
		Hold:             e.cfg.Fusion.Hold,
		MaxBufferedBytes: e.cfg.Fusion.MaxBufferedBytes,
		// An idle push commits on its caller's goroutine: no hand-off.
		Inline: true,
		FlushContext: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(e.ctx, e.cfg.StatementTimeout)
		},
	}, p.flush)
	return p
}

// close flushes what fusion holds; what it cannot flush before ctx ends is
// spooled (Buffered), or failed with ErrClosed if the spool fails too.
func (p *pusher) close(ctx context.Context) error {
	err := p.fusion.Close(ctx, func(bundle []*fusion.Batch[partitionKey, *pushItem]) {
		p.spoolBundle(bundle, nil, ErrClosed)
	})
	p.cleanups.Wait() // each at most 5s
	return err
}

// spoolBundle spools the items of a bundle that could not commit (Buffered;
// spoolItems seals them if the client has a key); batches in skip are
// already resolved.
func (p *pusher) spoolBundle(bundle []*fusion.Batch[partitionKey, *pushItem], skip map[*fusion.Batch[partitionKey, *pushItem]]bool, cause error) {
	gs := make([]spoolGroup, 0, len(bundle))
	for _, b := range bundle {
		b.Retry = nil // resolved here, never sent again
		if skip[b] {
			continue
		}
		gs = append(gs, spoolGroup{items: b.Items, key: b.Key, cause: cause})
	}
	p.e.spoolGroups(gs) // one write for the bundle
}

// failBundle fails the items of a bundle; batches in skip are already
// resolved.
func failBundle(bundle []*fusion.Batch[partitionKey, *pushItem], skip map[*fusion.Batch[partitionKey, *pushItem]]bool, err error) {
	for _, b := range bundle {
		b.Retry = nil
		if skip[b] {
			continue
		}
		for _, it := range b.Items {
			resolveFailed(it, err)
		}
	}
}

// flushScratch is per-flush working memory, pooled.
type flushScratch struct {
	bundle   alloc.Bundle
	verdicts []alloc.Verdict
	segs     []segPlan
	raw      []byte
	blobs    []byte
	hashes   []byte
	hs       []dedup.Hash
	leaders  []int
	// frames backs the segPlans' frames: one allocation for a bundle
	// rather than one per segment, most of them one message long.
	frames []*pushItem
	// take is the lingering worker whose slot pushLive reserved, and ho
	// the outcome commit hands it on return (see handOff).
	take *lingerSlot
	ho   handoff
}

// segPlan is how one batch became one segment: which items are its frames.
type segPlan struct {
	batch  *fusion.Batch[partitionKey, *pushItem]
	frames []*pushItem // leaders in frame order
	n      int         // the segment holds batch.Items[:n]; the rest waits
	key    uint64      // batch.Key.Hash(), for knownParts
}

// defaultMaxBundleBytes bounds the frame bytes of one push_bundle call.
// PostgreSQL refuses a protocol message of 1 GiB or more, and a bytea[]
// value that large, so a bigger bundle could only fail whole (and its
// replay from the spool the same way). 64 MiB keeps a call far below that
// (a blob is at most its frames and a codec byte; the other arrays add 16
// bytes a frame and the names) and bounds the memory one call costs the
// server, which holds the message, the array and the rows at once. The
// first frame of a bundle always goes, and MaxPayloadSize is 16 MiB, so no
// call is over the bound. Tests lower it (testConfig.maxBundleBytes).
const defaultMaxBundleBytes = 64 << 20

// frameBytes over-estimates the item's frame and hash in a bundle.
func (it *pushItem) frameBytes() int {
	return len(it.Payload) + len(it.TransactionID) + len(it.Key) + len(it.Headers) + 64
}

var scratchPool = sync.Pool{New: func() any { return new(flushScratch) }}

// flush commits one bundle. It runs with the engine's context: on a fusion
// goroutine, or on the goroutine of an idle push (fusion's Config.Inline),
// whose own context then ends it too, as it would end an INSERT (see
// callerGone).
func (p *pusher) flush(ctx context.Context, bundle []*fusion.Batch[partitionKey, *pushItem]) error {
	ctx, end := p.e.startFlush(ctx, bundle)
	var err error
	if parts := p.byWorker(bundle); parts != nil {
		err = p.commitParts(ctx, parts)
	} else {
		err = p.commit(ctx, p.e.pool, bundle, true)
	}
	end(err)
	return err
}

// commit sends bundle as one push_bundle call on q and resolves its items;
// items to send again are left in each batch's Retry. live is false inside a
// caller's transaction, where nothing is committed yet: no wake-ups, no
// metrics, and a failure is returned rather than spread over the items.
func (p *pusher) commit(ctx context.Context, q alloc.Querier, bundle []*fusion.Batch[partitionKey, *pushItem], live bool) error {
	e := p.e
	s := scratchPool.Get().(*flushScratch)
	defer func() {
		s.bundle.Reset()
		clear(s.segs)
		s.segs = s.segs[:0]
		clear(s.frames)
		s.frames = s.frames[:0]
		scratchPool.Put(s)
	}()
	// The arenas back the previous bundle's blobs, which are done with.
	s.blobs, s.hashes = s.blobs[:0], s.hashes[:0]
	// Last, after the wake-ups: the worker the push took for hears of the
	// push while it still lingers (the fetch loop ignores the wake), and
	// gets an outcome on every path, a panic's included.
	defer func() {
		if s.take != nil {
			s.take.out <- s.ho
			s.take, s.ho = nil, handoff{}
		}
	}()

	var skip map[*fusion.Batch[partitionKey, *pushItem]]bool
	if live {
		var err error
		if skip, err = p.openSpooled(ctx, bundle); err != nil {
			err = fmt.Errorf("queen: push bundle: %w", err)
			if callerGone(ctx) {
				failBundle(bundle, skip, err)
			} else {
				p.spoolBundle(bundle, skip, err)
			}
			return err
		}
	}
	// What does not fit under the bundle bound waits for its key's next
	// flush (Batch.Retry): a whole batch, or the rest of one from the first
	// item that does not fit. Order within a key is kept.
	room, first, sent := p.e.cfg.test.maxBundleBytes, true, 0
	for _, b := range bundle {
		if skip[b] {
			continue
		}
		n := len(b.Items)
		for i, it := range b.Items {
			sz := it.frameBytes()
			if sz > room && !first {
				n = i
				break
			}
			room -= sz
			first = false
		}
		if n == 0 {
			b.Retry = b.Items
			continue
		}
		s.segs = append(s.segs, p.buildSegment(s, b, n))
		sent += n
	}
	if len(s.segs) == 0 {
		return nil
	}

	start := time.Now()
	var err error
	if live {
		s.verdicts, err = p.pushLive(ctx, s)
	} else {
		s.verdicts, err = stmt.PushBundle(ctx, e.sql, q, &s.bundle, s.verdicts)
	}
	if !live {
		if err != nil {
			return fmt.Errorf("queen: push: %w", err)
		}
	} else {
		if err != nil && callerGone(ctx) {
			// Like an INSERT whose caller gave up: the outcome is unknown,
			// the caller gets its ctx.Err() and nothing is spooled, since
			// the database did not fail.
			err = fmt.Errorf("queen: push bundle: %w", err)
			failBundle(bundle, skip, err)
			return err
		}
		e.meter.bundle(ctx, len(s.segs), sent, err, time.Since(start))
		if err != nil {
			// Nothing of the bundle committed: spool its items (Buffered)
			// so a caller checking only for errors loses nothing.
			err = fmt.Errorf("queen: push bundle: %w", err)
			p.spoolBundle(bundle, skip, err)
			return err
		}
	}
	var segCache map[segKey]alloc.CoveringSegment
	for i := range s.segs {
		sp := &s.segs[i]
		v := &s.verdicts[i]
		switch v.Status {
		case alloc.Queued:
			for k, it := range sp.frames {
				it.resolve(PushResult{Status: Queued, MessageID: it.ID, Offset: v.BaseOffset + int64(k), CreatedAt: v.CreatedAt})
			}
			if sp.n < len(sp.batch.Items) {
				// The rest waits, but for followers of what was stored.
				var retry []*pushItem
				for _, it := range sp.batch.Items[sp.n:] {
					if !it.resolved {
						retry = append(retry, it)
					}
				}
				sp.batch.Retry = retry
			}
		case alloc.Duplicate:
			if segCache == nil {
				segCache = make(map[segKey]alloc.CoveringSegment)
			}
			for j, k := range v.DupIdx {
				it := sp.frames[k]
				id, created := p.originalID(ctx, q, segCache, v.PartitionID, v.DupOff[j])
				it.resolve(PushResult{Status: Duplicate, MessageID: id, Offset: -1, CreatedAt: created})
			}
			// Frames that were not duplicates go back to the head of the
			// partition and are sent again in the next segment, before the
			// items that did not fit this bundle.
			var retry []*pushItem
			for _, it := range sp.batch.Items {
				if !it.resolved {
					retry = append(retry, it)
				}
			}
			sp.batch.Retry = retry
		case alloc.EncryptionRequired:
			// The queue was switched to encryption after this client cached
			// its options: encrypt and send again, or fail without a key.
			e.forgetMeta(sp.batch.Key.Tenant, sp.batch.Key.Queue)
			if !e.keys.CanSeal() {
				for _, it := range sp.batch.Items {
					resolveFailed(it, errNoKey(sp.batch.Key.Queue))
				}
				continue
			}
			for _, it := range sp.batch.Items {
				if it.Flags&frame.FlagEncrypted == 0 {
					it.Payload, it.Flags = e.keys.Seal(sp.batch.Key.Tenant, sp.batch.Key.Queue, sp.batch.Key.Partition, it.Key, it.Headers, it.ID, it.Payload), it.Flags|frame.FlagEncrypted
				}
			}
			sp.batch.Retry = sp.batch.Items
		case alloc.LanesChanged:
			// Keys were routed to lanes with a stale lane count: their
			// pushes route them again with the queue's (see sentBack). The
			// items that chose this partition themselves go again here.
			// Every item, a layer-2 follower included, is handled on its
			// own: each is some caller's.
			e.forgetMeta(sp.batch.Key.Tenant, sp.batch.Key.Queue)
			var retry []*pushItem
			for _, it := range sp.batch.Items {
				if it.lanes == 0 {
					retry = append(retry, it)
					continue
				}
				it.resolved = true
				it.res.Status, it.res.Offset, it.res.Err = Failed, -1, errLanesChanged
			}
			sp.batch.Retry = retry
		default:
			for _, it := range sp.batch.Items {
				resolveFailed(it, fmt.Errorf("%w: status %d", alloc.ErrBadResult, v.Status))
			}
		}
	}
	if live {
		// Consumers of the stored segments' partitions, under one lock.
		e.wake.PushedAll(func(yield func(wake.QueueKey, string) bool) {
			for i := range s.segs {
				if s.verdicts[i].Status != alloc.Queued {
					continue
				}
				k := s.segs[i].batch.Key
				if !yield(wake.QueueKey{Tenant: k.Tenant, Queue: k.Queue}, k.Partition) {
					return
				}
			}
		})
		p.summary(len(s.segs), sent)
	}
	return nil
}

// buildSegment does layer-2 dedup over the batch and packs the leaders
// among its first n items into frames, the hash blob and the compressed
// payload blob. An item past n whose leader is among them is a follower
// too: sent in a later bundle, it would be stored again on a queue without
// a dedup window.
func (p *pusher) buildSegment(s *flushScratch, b *fusion.Batch[partitionKey, *pushItem], n int) segPlan {
	s.hs = s.hs[:0]
	for _, it := range b.Items {
		it.followers, it.resolved = it.followers[:0], false
		s.hs = append(s.hs, it.hash)
	}
	s.leaders = dedup.Leaders(s.hs, s.leaders)
	for k := n; k < len(b.Items); k++ {
		if l := s.leaders[k]; l < n {
			b.Items[l].followers = append(b.Items[l].followers, b.Items[k])
		}
	}
	items := b.Items[:n]
	frameStart := len(s.frames)
	hashStart := len(s.hashes)
	var flags int32 = alloc.FlagEncrypted
	var lanes int32 // see alloc.Segment.Lanes
	size := 0       // of the packed frames
	for k, it := range items {
		if l := s.leaders[k]; l != k {
			leader := items[l]
			leader.followers = append(leader.followers, it)
			continue
		}
		s.frames = append(s.frames, it)
		s.hashes = dedup.AppendHash(s.hashes, it.hash)
		size += frame.Size(&it.Frame)
		if it.Flags&frame.FlagEncrypted == 0 {
			flags &^= alloc.FlagEncrypted
		}
		if it.Key != "" {
			flags |= alloc.FlagKeyed
		}
		if it.lanes != 0 && lanes != it.lanes {
			if lanes == 0 {
				lanes = it.lanes
			} else {
				lanes = -1 // routed with two counts: one is stale
			}
		}
	}
	frames := s.frames[frameStart:len(s.frames):len(s.frames)]
	blobStart := len(s.blobs)
	if segment.StoresRaw(size) {
		// The blob Compress would make, packed in place: the payloads are
		// copied once, not into s.raw and again into the blob.
		s.blobs = segment.AppendRawHeader(s.blobs, size)
		for _, it := range frames {
			s.blobs = frame.Append(s.blobs, &it.Frame)
		}
	} else {
		s.raw = s.raw[:0]
		for _, it := range frames {
			s.raw = frame.Append(s.raw, &it.Frame)
		}
		s.blobs = segment.Compress(s.blobs, s.raw)
	}
	s.bundle.Add(&alloc.Segment{
		Tenant:    b.Key.Tenant,
		Queue:     b.Key.Queue,
		Partition: b.Key.Partition,
		Count:     int32(len(frames)),
		Hashes:    s.hashes[hashStart:len(s.hashes):len(s.hashes)],
		Blob:      s.blobs[blobStart:len(s.blobs):len(s.blobs)],
		Flags:     flags,
		Lanes:     lanes,
	})
	return segPlan{batch: b, frames: frames, n: n, key: batchHash(b)}
}

// batchHash is b.Key.Hash(): as fusion computed it for its batches, or
// computed here for a batch built elsewhere (a transaction's), which leaves
// Hash zero. The key's strings are not read again on the flush's goroutine,
// where they are often out of the cache.
func batchHash(b *fusion.Batch[partitionKey, *pushItem]) uint64 {
	if b.Hash != 0 {
		return b.Hash
	}
	return b.Key.Hash()
}

type segKey struct {
	pid  int64
	base int64
}

// originalID resolves the message id stored at (pid, off) by unpacking the
// covering segment. The zero UUID means retention removed it. Rare path.
func (p *pusher) originalID(ctx context.Context, q alloc.Querier, cache map[segKey]alloc.CoveringSegment, pid, off int64) (uuid.UUID, time.Time) {
	for k, seg := range cache {
		if k.pid == pid && off >= seg.BaseOffset && off <= seg.EndOffset {
			return frameID(seg, off)
		}
	}
	seg, found, err := stmt.SegmentAt(ctx, p.e.sql, q, pid, off)
	if err != nil || !found {
		if err != nil {
			p.e.log.Warn("queen: resolve duplicate's original id", "partition_id", pid, "offset", off, "err", err)
		}
		return uuid.Nil, time.Time{}
	}
	cache[segKey{pid, seg.BaseOffset}] = seg
	return frameID(seg, off)
}

func frameID(seg alloc.CoveringSegment, off int64) (uuid.UUID, time.Time) {
	raw, err := segment.Decompress(nil, seg.Blob)
	if err != nil {
		return uuid.Nil, time.Time{}
	}
	f, err := frame.At(raw, int(off-seg.BaseOffset))
	if err != nil {
		return uuid.Nil, time.Time{}
	}
	return f.ID, seg.CreatedAt
}

// resolve writes the item's verdict into its own result and its followers'.
func (it *pushItem) resolve(r PushResult) {
	it.resolved = true
	it.res.Status, it.res.MessageID, it.res.Offset, it.res.CreatedAt, it.res.Err = r.Status, r.MessageID, r.Offset, r.CreatedAt, r.Err
	for _, fi := range it.followers {
		fi.resolved = true
		f := fi.res
		f.Status, f.Offset, f.Err = Duplicate, -1, nil
		f.MessageID, f.CreatedAt = r.MessageID, r.CreatedAt
		if r.Status != Queued && r.Status != Duplicate {
			f.Status, f.Err = r.Status, r.Err
		}
	}
}

func resolveFailed(it *pushItem, err error) {
	it.resolve(PushResult{Status: Failed, MessageID: it.ID, Offset: -1, Err: err})
}

// pushLive runs the bundle on a connection of its own. If the statement
// times out, the server is sent a cancel request (a client-side timeout
// alone leaves the statement running and holding its partition locks) and
// the connection is discarded rather than returned to the pool.
func (p *pusher) pushLive(ctx context.Context, s *flushScratch) ([]alloc.Verdict, error) {
	e := p.e
	if err := e.downErr(); err != nil {
		return s.verdicts, err
	}
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		err = fmt.Errorf("acquire connection: %w", err)
		if e.ctx.Err() == nil && !callerGone(ctx) {
			e.noteDown(err)
		}
		return s.verdicts, err
	}
	e.noteUp()
	var (
		v   []alloc.Verdict
		pid int64 // an isolated push's partition id, as known
	)
	if len(s.segs) == 1 {
		pid, s.bundle.Known = p.known.one(s.segs[0].key)
	} else {
		s.bundle.Known = p.known.all(s.segs)
	}
	// The bundle answered another id than the one known: remember its.
	stale := false
	if s.bundle.Known && s.bundle.Len() == 1 {
		// An isolated push: one segment to a partition already written to.
		// Without a dedup window (as its first item was prepared with) it is
		// one plain statement; with one, or settings unknown, the
		// single-segment function, half push_bundle's server time. Either
		// may leave it to push_bundle, which gives every other verdict.
		// On the Citus layout only the function runs: AppendSegment reads
		// the time in DML, which Citus refuses on a distributed table.
		var q alloc.Querier = conn
		var tq *stmt.TakeQuerier
		if s.take = e.lingers.reserve(s.segs[0].batch.Key); s.take != nil {
			// A worker of this client lingers on the partition: the
			// push takes for it (see handOff).
			tq = stmt.NewTakeQuerier(e.csql, conn.Conn(), s.take.lease, s.take.max, s.take.leaseDur)
			q = tq
			if h := e.cfg.test.takeHook; h != nil {
				h()
			}
		}
		if s.segs[0].frames[0].noWindow && !e.cfg.Citus {
			v, err = stmt.AppendSegment(ctx, e.sql, q, &s.bundle, pid, s.verdicts)
		} else {
			v, err = stmt.PushSegment(ctx, e.sql, q, &s.bundle, s.verdicts)
		}
		if tq != nil {
			s.ho, err = handOff(tq, err)
		}
		if err == nil && v[0].Status == alloc.NeedsBundle {
			v = nil
		}
		// push_segment finds the row by its derived id, not the one
		// known: its verdict's id replaces a wrong one too.
		stale = err == nil && v != nil && v[0].PartitionID != 0 && v[0].PartitionID != pid
	}
	if err == nil && v == nil {
		v, err = stmt.PushBundle(ctx, e.sql, conn, &s.bundle, s.verdicts)
		stale = err == nil && s.bundle.Known && len(v) == 1 && v[0].PartitionID != pid
	}
	if isCode(err, codePartitionGone) {
		// A partition was purged (maintenance forgets idle ones) after this
		// client saw it, or between the bundle's provisioning and its lock:
		// once more with provisioning, which recreates it.
		p.known.forget(s.segs)
		s.bundle.Known = false
		v, err = stmt.PushBundle(ctx, e.sql, conn, &s.bundle, v)
	}
	if err == nil && (!s.bundle.Known || stale) {
		// A bundle found all known, with the ids known, adds nothing:
		// skip the write lock and a map assignment per segment.
		p.known.add(s.segs, v)
	}
	if err != nil && (ctx.Err() != nil || pgconn.Timeout(err)) {
		if e.ctx.Err() == nil && !callerGone(ctx) {
			// Bundles queued behind this one would time out the same way.
			e.noteDown(err)
		}
		// The cancel request can take as long as the trouble it is for, so
		// it runs in the background and the items are spooled meanwhile.
		p.cleanups.Add(1)
		go func() {
			defer p.cleanups.Done()
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if cerr := conn.Conn().PgConn().CancelRequest(cctx); cerr != nil {
				e.log.Warn("queen: cancel request for a timed-out bundle", "err", cerr)
			}
			cancel()
			_ = conn.Conn().Close(context.Background())
			conn.Release()
		}()
		return v, err
	}
	conn.Release()
	return v, err
}

// handOff ends tq's pipeline, the push (whose error is err) and the take
// of a lingering worker's messages in one transaction, and returns the
// outcome for the worker and the push's error: the pipeline's through its
// commit, so a push is never reported stored whose commit is unknown. The
// outcome is known only when the push committed; then rows are what the
// take took under the worker's lease (or over says the linger is over).
// push_take fails nothing, so a take never fails a push.
func handOff(tq *stmt.TakeQuerier, err error) (handoff, error) {
	var h handoff
	sent, over, ferr := tq.Finish(func(r *stmt.PopRow) error {
		h.rows = append(h.rows, *r) // the row is reused, its slices are not
		return nil
	})
	if err == nil && sent {
		err = ferr
	}
	if err == nil && sent {
		h.known, h.over = true, over
	} else {
		h.rows = nil
	}
	return h, err
}

// callerGone reports that ctx is an inline flush's (an idle push run on its
// caller's goroutine) and was cancelled because the caller's context ended:
// not a failure of the database.
func callerGone(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), fusion.ErrCallerGone)
}

// knownParts remembers partitions this client has committed to, so bundles
// made only of them skip the database's provisioning check, and each one's
// id as its last verdict gave it, which an isolated push names the row by.
// It maps their keys' hashes to the ids: a map without pointers, which the
// garbage collector does not scan, and whose lookups compare no strings.
// Two keys with one hash cost at most a retry: a bundle wrongly claimed
// known fails with QN001, writing nothing, and is sent again with
// provisioning, and a wrong id finds no row of that queue and name, so the
// push goes through the bundle (see pushLive).
type knownParts struct {
	mu sync.RWMutex
	m  map[uint64]int64
}

// knownMax bounds the memory: past it the set starts over.
const knownMax = 1 << 20

func (k *knownParts) all(segs []segPlan) bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	for _, sp := range segs {
		if _, ok := k.m[sp.key]; !ok {
			return false
		}
	}
	return true
}

// one reports whether the partition of key is known, and its id.
func (k *knownParts) one(key uint64) (pid int64, ok bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	pid, ok = k.m[key]
	return pid, ok
}

// add records segs' partitions with the ids of their verdicts v (0 where v
// does not pair with segs).
func (k *knownParts) add(segs []segPlan, v []alloc.Verdict) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil || len(k.m) >= knownMax {
		k.m = make(map[uint64]int64)
	}
	for i, sp := range segs {
		var pid int64
		if len(v) == len(segs) {
			pid = v[i].PartitionID
		}
		k.m[sp.key] = pid
	}
}

func (k *knownParts) forget(segs []segPlan) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, sp := range segs {
		delete(k.m, sp.key)
	}
}

// codePartitionGone is push_bundle's SQLSTATE for a partition that vanished
// between provisioning and locking.
const codePartitionGone = "QN001"

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// summary logs commits, segments and segments_per_commit about every 10s,
// at Debug (nobody acts on it):
// segments far above commits is the evidence that fusion coalesces.
func (p *pusher) summary(segments, items int) {
	p.sumMu.Lock()
	p.sumCommits++
	p.sumSegments += int64(segments)
	p.sumItems += int64(items)
	if time.Since(p.sumAt) < 10*time.Second {
		p.sumMu.Unlock()
		return
	}
	c, s, n := p.sumCommits, p.sumSegments, p.sumItems
	p.sumCommits, p.sumSegments, p.sumItems, p.sumAt = 0, 0, 0, time.Now()
	p.sumMu.Unlock()
	p.e.log.Debug("queen: fusion bundle summary", "commits", c, "segments", s, "items", n,
		"segments_per_commit", float64(s)/float64(c))
}
