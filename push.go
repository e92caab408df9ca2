package queen

import (
	"context"
	"fmt"
	"iter"
	"strconv"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/zeebo/xxh3"
	"go.opentelemetry.io/otel/trace"

	"github.com/e03140bc/queen/dedup"
	"github.com/e03140bc/queen/fusion"
	"github.com/e03140bc/queen/internal/frame"
)

// Limits on what one item may carry. Larger input is rejected with
// ErrTooLarge before anything is written.
const (
	// MaxNameLen is the longest queue or partition name, in bytes.
	MaxNameLen = 255
	// MaxTransactionIDLen is the longest transaction id, in bytes.
	MaxTransactionIDLen = 1024
	// MaxKeyLen is the longest ordering key (Item.Key), in bytes.
	MaxKeyLen = 255
	// MaxHeadersSize is the most an item's headers (Item.Headers) may take
	// encoded, in bytes: per header its name and value and a length
	// prefix of each, plus a count.
	MaxHeadersSize = 64 << 10
	// MaxPayloadSize is the largest payload, in bytes (before encryption).
	MaxPayloadSize = 16 << 20
	// DefaultPartition is the partition of an Item with an empty Partition.
	DefaultPartition = "Default"
)

// Item is one message to push.
type Item struct {
	Data          []byte // payload, opaque bytes (JSON by convention); nil and empty are valid
	Partition     string // "" means "Default", or the key's lane for an item with a Key; a partition is an ordered lane and the per-key unit
	TransactionID string // "" means the minted message id as a string; the idempotency key; UTF-8 without NUL
	// Key is the message's ordering key inside its partition ("" for
	// none): at most MaxKeyLen bytes of UTF-8 without NUL, else the whole
	// call fails with ErrInvalidName and writes nothing. An item with a
	// Key and no Partition goes to the keyed lane of its key (see
	// QueueOptions.Lanes), so one key's messages share a partition and keep
	// their order; with a Partition it stays there. PushResult.Partition
	// names the lane; for a Buffered item it is provisional: if the queue's
	// lane count turns out to differ from the one this client knew, the
	// replay stores the item in the lane the queue's count gives. It is
	// returned as Message.Key and DeadLetter.Key. On an encrypted queue the key, like the partition name,
	// is routing metadata: stored in the clear, not encrypted, but
	// authenticated with the payload, so a key altered in storage makes the
	// message undecodable.
	Key string
	// Headers are the message's metadata (for example trace context),
	// returned as Message.Headers and DeadLetter.Headers and kept by every
	// path a message takes: PushTx, Tx.Push, the disk spool, the skip
	// policy's re-enqueue and dead letters. Names are non-empty; names and
	// values are UTF-8 without NUL, else the whole call fails with
	// ErrInvalidName. Encoded they may take at most MaxHeadersSize bytes,
	// else the whole call fails with ErrTooLarge. Nothing is written in
	// either case. Defaults to nil: no headers, at no cost. On an encrypted
	// queue the headers, like the key, are stored in the clear, not
	// encrypted, but authenticated with the payload, so headers altered in
	// storage make the message undecodable: do not put secrets in them.
	// With tracing on (Config.TracerProvider) the push adds the trace
	// context (Config.Propagator's names, such as "traceparent") to a copy
	// of each item's headers; a name the item already has keeps the item's
	// value. Item.Headers itself is never modified.
	Headers map[string]string
	// DeliverAt schedules the message: it is visible to no consumer before
	// this time. Push holds it aside (not in its partition, whose later
	// messages keep flowing) and reports it Scheduled; once due, a client
	// of the schema appends it to its partition as a push would, within
	// tens of milliseconds when idle. The time is compared with the
	// database's clock. For a delay, use time.Now().Add(d). Zero, or a
	// time not after the push's start, is an ordinary push. At most
	// MaxDeliverAhead ahead, else the whole call fails with ErrTooLarge
	// and writes nothing. A scheduled transaction id is a Duplicate of
	// itself while it waits, and the queue's DedupWindow applies again when
	// it is appended (see Queue.CancelScheduled, QueueStatus.Scheduled).
	// Only Push schedules: PushTx and Client.Tx fail the call. Defaults to
	// zero: deliver now.
	DeliverAt time.Time
}

// PushStatus is the outcome of one pushed item.
type PushStatus string

// Push outcomes.
const (
	Queued    PushStatus = "queued"
	Duplicate PushStatus = "duplicate"
	Buffered  PushStatus = "buffered" // in the disk spool; will be replayed idempotently
	Failed    PushStatus = "failed"
	// Scheduled: held until Item.DeliverAt; MessageID is the id it will
	// be delivered with, Partition its partition; Offset is -1.
	Scheduled PushStatus = "scheduled"
)

// PushResult is the outcome of one item, at the item's index.
type PushResult struct {
	Status        PushStatus
	MessageID     uuid.UUID // UUIDv7; for Duplicate, the id of the original message (zero UUID if it was retained away)
	TransactionID string
	Partition     string
	Offset        int64 // the message's offset in its partition; -1 unless Queued
	CreatedAt     time.Time
	Err           error // set when Failed
}

// pushItem is one frame on its way through fusion. The handler fills it; the
// flush resolves it by writing res (and the results of its followers).
type pushItem struct {
	// Frame is the message as it will be stored: id, flags, transaction
	// id, key, encoded headers and payload (ciphertext once sealed).
	frame.Frame
	hash dedup.Hash
	// lanes is the lane count the item was routed to its lane with; 0 when
	// it was not routed (no key, or its own Partition).
	lanes int32
	// noWindow: the queue had no dedup window by the settings the item was
	// prepared with, so an isolated push of it may take AppendSegment.
	noWindow bool
	res      *PushResult
	// followers are layer-2 duplicates (same hash in the same flush) that
	// take this item's verdict.
	followers []*pushItem
	resolved  bool
	// noSpool marks items replayed from the spool: a failure fails them
	// (the drain retries) instead of spooling them again.
	noSpool bool
	// send is the push call's recording send span, which the flush span
	// links to; nil when not tracing.
	send trace.Span
}

// pushItemOverhead approximates what an item holds besides its payload and
// transaction id: itself, its result and its share of the batch.
const pushItemOverhead = 256

// Bytes is what the item holds, for FusionConfig.MaxBufferedBytes.
func (it *pushItem) Bytes() int {
	return len(it.Payload) + len(it.TransactionID) + len(it.Key) + len(it.Headers) + pushItemOverhead
}

// submitAndWait is f.SubmitWait with the client's error for a closed engine.
func submitAndWait[K fusion.Keyer, T comparable](ctx context.Context, f *fusion.Engine[K, T], n int, groups iter.Seq2[K, []T]) error {
	err := f.SubmitWait(ctx, n, groups)
	if err == fusion.ErrClosed {
		return ErrClosed
	}
	return err
}

// ValidName reports whether s can name a queue, a partition or a consumer
// group: 1 to MaxNameLen bytes of UTF-8 without control characters. Calls
// given another name fail with ErrInvalidName; tools can check up front.
func ValidName(s string) bool { return checkName(nameQueue, s) == nil }

// laneNames are the names of the first lanes, so routing a key to a lane
// costs no allocation for the usual lane counts.
var laneNames = func() []string {
	n := make([]string, 4*DefaultLanes)
	for i := range n {
		n[i] = "lane-" + strconv.Itoa(i)
	}
	return n
}()

// laneOf is the partition of a key routed to one of lanes keyed lanes: see
// QueueOptions.Lanes. lanes is positive.
func laneOf(key string, lanes int32) string {
	i := xxh3.HashString(key) % uint64(lanes)
	if i < uint64(len(laneNames)) {
		return laneNames[i]
	}
	return "lane-" + strconv.FormatUint(i, 10)
}

// Push stores items and returns one result per item, in input order. It
// returns when every partition it wrote to has committed. Its error is for
// the call as a whole: a closed client, an invalid name or size (nothing is
// written then), or a cancelled context. A cancelled caller only stops
// waiting: items already handed to the engine may still commit, so retry
// with the same TransactionIDs on a queue with a DedupWindow.
// An idle push (one partition, nothing else of its fusion shard pending or
// in flight) commits alone on the calling goroutine; a ctx that ends during
// that commit cancels its statement as it would an INSERT's, with the same
// unknown outcome, rather than only stop the wait.
//
// Per partition, one client's pushes are stored in push order (a Push that
// returned before the next one began is stored first). While a partition
// has items in the disk spool (reported Buffered and not yet replayed),
// later pushes to it are spooled behind them and reported Buffered too,
// rather than overtake them; they are stored when the drain gets there.
// PushTx and Client.Tx are never spooled, so they can overtake.
//
// Items with an Item.DeliverAt ahead are Scheduled: held aside and appended
// to their partitions when due (see Item.DeliverAt). They are written in a
// transaction of their own, before the call's other items, and are not
// spooled: when the database does not answer within StatementTimeout they
// are Failed (not stored: the transaction is committed only once its
// statement answered), while the call's other items are Buffered as below.
// Should the commit itself go unanswered, the call asks again by their
// transaction ids for up to twice StatementTimeout, and if the database
// still does not tell, Push fails with an error saying their outcome is
// unknown.
//
// When PostgreSQL is down, or in maintenance mode, items go to the disk
// spool and are Buffered, after at most about Config.StatementTimeout plus
// the spool's write and fsync (a slow disk delays Buffered; it never turns
// into Failed an item that is then stored). A
// client with Config.EncryptionKey encrypts everything it spools; the replay
// stores it in plaintext again if its queue is not encrypted. A client
// without one spools plaintext only for a queue it knows is not encrypted:
// it read the queue's setting (within the last 5 seconds or before the
// outage), or, for a queue it has not seen, the queue was not among the
// schema's encrypted queues, which it reads at Open and every few seconds
// while the database answers. A push to a queue that was encrypted fails
// with ErrEncryption, as does one when it could not read that list since
// Open. The one window: a queue another process makes encrypted during the
// outage, not seen encrypted by this client, is spooled in plaintext (on
// this client's disk); its replay is refused by the database, which stores
// no plaintext in an encrypted queue, and the records are quarantined.
func (q *Queue) Push(ctx context.Context, items []Item) (res []PushResult, err error) {
	ctx, items, end := q.c.e.startSend(ctx, q.name, items)
	defer func() { end(err) }()
	return q.push(ctx, items)
}

func (q *Queue) push(ctx context.Context, items []Item) ([]PushResult, error) {
	if anyScheduled(items) {
		return q.pushScheduled(ctx, items)
	}
	return q.pushNow(ctx, items)
}

// pushNow is push for items none of which is scheduled.
func (q *Queue) pushNow(ctx context.Context, items []Item) ([]PushResult, error) {
	e := q.c.e
	b, err := q.prepareFor(ctx, items, true)
	if err != nil {
		return nil, err
	}
	defer b.release()
	if len(b.groups) == 0 { // no items
		return b.results, nil
	}
	key := partitionKey{Tenant: q.c.tenant, Queue: q.name}
	finish := func() []PushResult {
		e.spoolFollowers(key, b)
		return b.finish()
	}
	if e.maintOn.Load() {
		e.spoolPush(key, b)
		return finish(), nil
	}
	if b.unknown != nil {
		// The database did not tell the queue's settings within
		// StatementTimeout: a bundle would fail the same way after waiting
		// as long again, so the items go to the spool now.
		e.spoolGroups(groupsOf(key, b.groups, b.unknown))
		return finish(), nil
	}
	// A partition with spooled items takes new ones behind them.
	if e.spoolBehind(q.c.tenant, q.name, b.groups); len(b.groups) == 0 {
		return finish(), nil
	}
	groups := func(yield func(partitionKey, []*pushItem) bool) {
		for part, g := range b.groups {
			if !yield(partitionKey{Tenant: q.c.tenant, Queue: q.name, Partition: part}, g) {
				return
			}
		}
	}
	if err := submitAndWait(ctx, e.push.fusion, len(b.groups), groups); err != nil {
		return nil, err
	}
	if err := q.rerouteLoop(ctx, b); err != nil {
		return nil, err
	}
	res := finish()
	b.recycle()
	return res, nil
}

// pushBatch is one call's items after the handler's work: minted, deduped
// (layer 1), encrypted and grouped by partition.
type pushBatch struct {
	results []PushResult
	groups  map[string][]*pushItem
	// leaderOf[i] >= 0 marks a layer-1 follower of that index.
	leaderOf []int
	// unknown is why the queue's settings are unknown (the database did not
	// answer); set only for a push that may go to the spool.
	unknown error
	// slab holds the call's items (a layer-1 follower's is not sent unless
	// a reroute makes it a leader).
	slab []pushItem
	// routed: some item was routed to a keyed lane, so the database may send
	// it back to be routed again (errLanesChanged).
	routed bool
}

// maxPooledSlab bounds the items of a slab kept for reuse (about 200 bytes
// each), so one large call does not pin its memory.
const maxPooledSlab = 4096

// slabPool holds cleared item slabs of pushes that were stored whole: a
// call spread over many partitions allocated about 200 bytes per item for
// its slab, the largest share of what a push gave the garbage collector.
var slabPool sync.Pool // of *[]pushItem

// getSlab is a slab of n items, each to be overwritten whole.
func getSlab(n int) []pushItem {
	if n <= maxPooledSlab {
		if p, _ := slabPool.Get().(*[]pushItem); p != nil && cap(*p) >= n {
			return (*p)[:n]
		}
	}
	return make([]pushItem, n)
}

// slabPoison, set by tests, overwrites a recycled slab where recycle would
// clear it, so that an item read after its reuse shows.
var slabPoison func([]pushItem)

// recycle returns the slab to slabPool when nothing can read its items
// again: each was stored (Queued) or found a Duplicate by a flush that has
// returned, its submission resolved and its verdict in results. A flush's
// stale copies of the pointers (a fusion batch before its shard clears it)
// are never followed once the submissions are done. Any other outcome
// (spooled, failed, an error) keeps the slab out: the spool or a flush
// still in flight may hold its items.
func (b *pushBatch) recycle() {
	slab := b.slab
	if cap(slab) > maxPooledSlab || cap(slab) == 0 {
		return
	}
	for i := range b.results {
		if st := b.results[i].Status; st != Queued && st != Duplicate {
			return
		}
	}
	b.slab = nil
	if slabPoison != nil {
		slabPoison(slab)
	} else {
		clear(slab) // drops the payloads and spans the items point to
	}
	slab = slab[:0]
	slabPool.Put(&slab)
}

// prepare validates everything first, so bad input writes nothing, then does
// the handler's work for one queue, for a push inside a transaction.
func (q *Queue) prepare(ctx context.Context, items []Item) (*pushBatch, error) {
	return q.prepareFor(ctx, items, false)
}

// prepareFor is prepare. spool says the push may go to the disk spool, so
// settings the database cannot tell do not fail it (see pushBatch.unknown).
func (q *Queue) prepareFor(ctx context.Context, items []Item, spool bool) (*pushBatch, error) {
	e := q.c.e
	if e.isClosed() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return nil, err
	}
	if err := checkItems(items); err != nil {
		return nil, err
	}
	b := &pushBatch{results: make([]PushResult, len(items)), groups: groupPool.Get().(map[string][]*pushItem)}
	if len(items) == 0 {
		return b, nil
	}
	meta, err := e.queueMeta(ctx, q.c.tenant, q.name)
	if err != nil {
		var lastEnc, lastKnown bool
		if spool && !e.keys.CanSeal() {
			lastEnc, lastKnown = e.lastEncrypted(q.c.tenant, q.name)
		}
		switch {
		case e.isClosed():
			err = ErrClosed
		case ctx.Err() != nil:
			err = ctx.Err()
		case spool && !e.keys.CanSeal() && lastKnown && !lastEnc:
			// Not encrypted at the last contact: spooled in plaintext, as
			// for a queue whose settings are cached.
			b.unknown, err = err, nil
		case spool && !e.keys.CanSeal() && lastEnc:
			err = errNoKey(q.name)
		case spool && !e.keys.CanSeal():
			// Spooling a payload in plaintext is only safe for a queue known
			// not to be encrypted.
			err = fmt.Errorf("%w: whether queue %q is encrypted is unknown (%w), and without Config.EncryptionKey its payloads could only be spooled in plaintext", ErrEncryption, q.name, err)
		case spool:
			// Spooled sealed, whatever the queue turns out to be.
			b.unknown, err = err, nil
		}
		if err != nil {
			b.release()
			return nil, err
		}
	}
	if meta.Encryption && !e.keys.CanSeal() {
		b.release()
		return nil, errNoKey(q.name)
	}
	if err := e.refuseUnreplayable(ctx, q.c.tenant, q.name, meta); err != nil {
		b.release()
		return nil, err
	}

	lanes := meta.Lanes
	if lanes <= 0 {
		// Unknown settings (spooled): route with the default; the replay's
		// bundle is checked against the queue's count and re-routed.
		lanes = DefaultLanes
	}
	slab := getSlab(len(items))
	b.slab = slab
	// firsts backs each group's first item, one allocation for the call
	// rather than one per partition, which a call spread over many
	// partitions (a partition per key) paid for nearly every item. Each
	// group's slice is capped at that one item, so appending a second
	// moves the group out rather than overwrite its neighbour.
	firsts := make([]*pushItem, len(items))
	send := e.sendSpan(ctx)
	l1 := layer1Pool.Get().(*dedup.Layer1)
	l1.Reset()
	defer func() { l1.Reset(); layer1Pool.Put(l1) }()
	var (
		ids   idMinter
		texts idTexts
	)
	for i := range items {
		it := &items[i]
		r := &b.results[i]
		part := it.Partition
		var routed int32
		if part == "" {
			if it.Key != "" {
				part, routed = laneOf(it.Key, lanes), lanes
				b.routed = true
			} else {
				part = DefaultPartition
			}
		}
		id, err := ids.next()
		if err != nil {
			b.release()
			return nil, fmt.Errorf("queen: mint message id: %w", err)
		}
		txn := it.TransactionID
		if txn == "" {
			txn = texts.text(id, len(items)-i)
		}
		*r = PushResult{MessageID: id, TransactionID: txn, Partition: part, Offset: -1}
		follower := false
		if it.TransactionID != "" {
			if leader, dup := l1.Check(q.name, part, txn, i); dup {
				if b.leaderOf == nil {
					b.leaderOf = make([]int, len(items))
					for k := range b.leaderOf {
						b.leaderOf[k] = -1
					}
				}
				b.leaderOf[i] = leader
				follower = true
			}
		}
		// A layer-1 follower is prepared too, but not sent: should the
		// database send the call back (a stale lane count), it may be a
		// message of its own (see rerouteCall).
		pi := &slab[i]
		hdrs := frame.EncodeHeaders(it.Headers)
		// Whole, as the slab may be a recycled one (see recycle).
		*pi = pushItem{
			Frame:    frame.Frame{ID: id, TransactionID: txn, Key: it.Key, Headers: hdrs, Payload: it.Data},
			hash:     dedup.Sum(txn),
			lanes:    routed,
			noWindow: !meta.Dedup && !meta.Fetched.IsZero(),
			res:      r,
			send:     send,
		}
		if meta.Encryption {
			pi.Payload = e.keys.Seal(q.c.tenant, q.name, part, it.Key, hdrs, id, it.Data)
			pi.Flags = frame.FlagEncrypted
		}
		if !follower {
			g := b.groups[part]
			if g == nil {
				g = firsts[i : i : i+1] // the append below fills firsts[i]
			}
			b.groups[part] = append(g, pi)
		}
	}
	return b, nil
}

// checkItems validates what every push checks of its items.
func checkItems(items []Item) error {
	for i := range items {
		it := &items[i]
		err := checkName(namePartition, it.Partition)
		if err == nil {
			err = checkName(nameTransactionID, it.TransactionID)
		}
		if err == nil {
			err = checkName(nameKey, it.Key)
		}
		if err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
		if len(it.Data) > MaxPayloadSize {
			return fmt.Errorf("%w: item %d: payload of %d bytes (max %d)", ErrTooLarge, i, len(it.Data), MaxPayloadSize)
		}
		if err := checkHeaders(i, it.Headers); err != nil {
			return err
		}
	}
	return nil
}

// checkHeaders validates item i's headers (see Item.Headers).
func checkHeaders(i int, h map[string]string) error {
	for k, v := range h {
		if err := checkName(nameHeader, k); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
		if !frame.ValidHeaderText(v) {
			return fmt.Errorf("%w: item %d: value of header %q is not UTF-8 text without NUL", ErrInvalidName, i, k)
		}
	}
	if n := frame.HeadersSize(h); n > MaxHeadersSize {
		return fmt.Errorf("%w: item %d: headers of %d bytes encoded (max %d)", ErrTooLarge, i, n, MaxHeadersSize)
	}
	return nil
}

// spoolFollowers spools the layer-1 followers routed by key whose leader
// went to the spool, behind it in its partition. They were duplicates of it
// there, but the replay routes the leader again under the queue's lane
// count, which may have changed, and a follower's key may not follow it. The
// replay pushes both in one group, so if they share a lane again the
// follower is a layer-2 duplicate of the leader, and otherwise it is stored
// in its own lane; either way it is not lost.
func (e *engine) spoolFollowers(key partitionKey, b *pushBatch) {
	var groups map[string][]*pushItem
	for i, l := range b.leaderOf {
		it := &b.slab[i]
		if l < 0 || it.lanes == 0 || it.resolved || b.results[l].Status != Buffered {
			continue
		}
		if groups == nil {
			groups = make(map[string][]*pushItem)
		}
		groups[it.res.Partition] = append(groups[it.res.Partition], it)
	}
	e.spoolGroups(groupsOf(key, groups, errBehindSpool))
}

// finish copies each leader's final verdict to its layer-1 followers and
// returns the results. A follower with a verdict of its own (spooled, see
// spoolFollowers) keeps it.
func (b *pushBatch) finish() []PushResult {
	for i, l := range b.leaderOf {
		if l < 0 || b.slab[i].resolved {
			continue
		}
		lr := &b.results[l]
		r := &b.results[i]
		switch lr.Status {
		case Queued, Duplicate:
			r.Status, r.MessageID = Duplicate, lr.MessageID
		default:
			r.Status, r.MessageID, r.Err = lr.Status, lr.MessageID, lr.Err
		}
		r.Partition = lr.Partition // a re-routed leader moved, and its followers with it
	}
	return b.results
}

// release returns the group map to its pool; the batch's items stay valid.
func (b *pushBatch) release() {
	if b.groups != nil {
		clear(b.groups)
		groupPool.Put(b.groups)
		b.groups = nil
	}
}

var (
	layer1Pool = sync.Pool{New: func() any { return new(dedup.Layer1) }}
	groupPool  = sync.Pool{New: func() any { return make(map[string][]*pushItem) }}
)
