package spool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
)

// SyncMode chooses how Append makes records durable.
type SyncMode int

const (
	// GroupCommit (the default) lets concurrent Appends share one fsync: a
	// single writer goroutine takes every request queued while the previous
	// fsync ran, writes them with one write and syncs once.
	GroupCommit SyncMode = iota
	// SyncEach writes and syncs every Append on its own, serialized.
	SyncEach
)

func (m SyncMode) String() string {
	switch m {
	case GroupCommit:
		return "GroupCommit"
	case SyncEach:
		return "SyncEach"
	}
	return fmt.Sprintf("SyncMode(%d)", int(m))
}

// Defaults for zero Options fields.
const (
	DefaultMaxFileSize        = 64 << 20
	DefaultMaxTotalSize       = 4 << 30
	DefaultReplayBatchRecords = 1000
	DefaultReplayBatchBytes   = 4 << 20
	DefaultReplayConcurrency  = 8
	DefaultQuarantineAfter    = 3
)

// Options configure a Spool. Only Dir is required.
type Options struct {
	// Dir holds the spool's files. It is created (0700) if missing and must
	// not be shared with another Spool (Open locks it).
	Dir string
	// MaxFileSize: a data file is rotated before an Append would take it past
	// this many bytes. A file exceeds it only when a single Append is larger.
	MaxFileSize int64
	// MaxTotalSize bounds the bytes of all pending data files plus the
	// Appends in progress; an Append beyond it fails with ErrFull.
	// Quarantined files do not count.
	MaxTotalSize int64
	// Sync is GroupCommit (the zero value) or SyncEach.
	Sync SyncMode
	// Logger receives torn tails, corruption, quarantines and I/O errors.
	// Defaults to slog.Default().
	Logger *slog.Logger

	// ReplayBatchRecords and ReplayBatchBytes bound one read chunk of
	// Replay; the chunk's records are grouped by key into the batches handed
	// to ReplayFunc. Defaults 1000 and 4 MiB.
	ReplayBatchRecords int
	ReplayBatchBytes   int
	// ReplayConcurrency is how many ReplayFunc calls (for distinct keys of
	// one chunk) may run at once. Default 8.
	ReplayConcurrency int
	// QuarantineAfter is how many Replay passes may fail with a Permanent
	// error at the first unreplayed record of a key (tenant, queue,
	// partition) before that record is quarantined on its own; a record of
	// the key stored meanwhile starts the count again. Default 3.
	QuarantineAfter int
}

func (o Options) withDefaults() Options {
	if o.MaxFileSize <= 0 {
		o.MaxFileSize = DefaultMaxFileSize
	}
	if o.MaxTotalSize <= 0 {
		o.MaxTotalSize = DefaultMaxTotalSize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ReplayBatchRecords <= 0 {
		o.ReplayBatchRecords = DefaultReplayBatchRecords
	}
	if o.ReplayBatchBytes <= 0 {
		o.ReplayBatchBytes = DefaultReplayBatchBytes
	}
	o.ReplayBatchBytes = max(o.ReplayBatchBytes, recordHeaderSize)
	if o.ReplayConcurrency <= 0 {
		o.ReplayConcurrency = DefaultReplayConcurrency
	}
	if o.QuarantineAfter <= 0 {
		o.QuarantineAfter = DefaultQuarantineAfter
	}
	return o
}

// Errors returned by the spool, matched with errors.Is.
var (
	// ErrClosed is returned by Append and Replay after Close began.
	ErrClosed = errors.New("spool: closed")
	// ErrFull is returned (wrapped) by an Append that would take the spool
	// past Options.MaxTotalSize. Nothing of that Append was written.
	ErrFull = errors.New("spool: full")
	// ErrTooLarge is returned (wrapped) for a record over MaxRecordSize.
	ErrTooLarge = errors.New("spool: record too large")
	// ErrLocked is returned by Open when another Spool holds the directory.
	ErrLocked = errors.New("spool: directory in use")
	// ErrUnsafeDir is returned (wrapped) by Open when the directory, a
	// symlink to it, or a spool file in it is owned by another user, or the
	// directory is writable by group or others: records someone else could
	// have written are never replayed.
	ErrUnsafeDir = errors.New("spool: directory not private to this user")
)

// Stats is a snapshot of a Spool's state.
type Stats struct {
	Files          int   // data files not yet fully replayed, or being appended to
	PendingRecords int64 // records not yet confirmed by Replay
	PendingBytes   int64 // their encoded bytes
	TotalBytes     int64 // what counts against MaxTotalSize

	Appended int64 // records made durable by Append since Open
	Fsyncs   int64 // data-file syncs since Open (Appended/Fsyncs is the group-commit factor)
	Replayed int64 // records confirmed by Replay since Open

	QuarantinedFiles   int   // *.spool.quarantine files in Dir, including those found by Open
	QuarantinedBytes   int64 // their size
	QuarantinedRecords int64 // records quarantined on their own since Open
	TornTails          int   // torn tails cut off by Open (never acknowledged records)

	LastError   error // the last I/O error, corruption, quarantine cause or ReplayFunc failure
	LastErrorAt time.Time
}

// file is one data file. Fields marked mu are guarded by Spool.mu (and the
// ones the writer changes are written under wmu too); w only by wmu;
// attempts only by replayMu.
type file struct {
	seq uint64

	size    int64 // mu: bytes synced (a record boundary); Replay reads below it
	records int64 // mu: records in [fileHeaderSize, size)
	sealed  bool  // mu: no more appends
	corrupt error // mu: the bytes at size are not a valid record (never torn)

	// A record is done once replay confirmed it stored, or quarantined it
	// on its own. acked is the prefix below which every record is done;
	// marks holds the done records past it (start offset to end offset).
	acked     int64              // mu
	marks     map[int64]int64    // mu
	doneRecs  int64              // mu: done records, below acked or marked
	doneBytes int64              // mu: their encoded bytes
	pend      map[groupKey]int64 // mu: records not done, per key

	ackSize int64 // the ack writer (one pass at a time): valid bytes of the ack file

	w *os.File // wmu: open for appends while active
}

// isDoneLocked reports whether the record starting at off is done.
func (f *file) isDoneLocked(off int64) bool {
	if off < f.acked {
		return true
	}
	_, ok := f.marks[off]
	return ok
}

// Spool is an append-only, crash-safe on-disk log of push records. Its
// methods are safe for concurrent use.
type Spool struct {
	opts Options
	log  *slog.Logger
	lock *os.File

	mu        sync.Mutex
	closed    bool
	files     []*file // oldest first, not quarantined
	total     int64   // bytes of files plus reservations of admitted Appends
	appended  int64
	fsyncs    int64
	replayed  int64
	qFiles    int
	qBytes    int64
	tornTails int
	lastErr   error
	lastErrAt time.Time
	qRecords  int64

	// keys counts the records not yet done per key over every file;
	// pendingAll is their sum, read without the lock by Pending.
	keys       map[groupKey]int64
	pendingAll atomic.Int64
	// lanes holds, per (tenant, queue) and partition with records not yet
	// done, the lane counts records with a Key were routed there with
	// (Record.Lanes): see PendingRouted.
	lanes map[queueKey]map[string][]uint32
	// keyFails counts the passes in a row whose replay of a key failed
	// permanently at its first record not done.
	keyFails map[groupKey]int

	// appenders counts Appends between admission and hand-off, so Close can
	// close reqs only when nobody can send on it any more.
	appenders sync.WaitGroup

	wmu     sync.Mutex
	active  *file
	nextSeq uint64
	wbuf    []byte

	reqs       chan *appendReq // GroupCommit only
	writerDone chan struct{}

	// replayMu serializes Replay passes and Close's final cleanup, and
	// guards the file records are quarantined to.
	replayMu    sync.Mutex
	qmu         sync.Mutex // the quarantine file, written by replay workers
	qfile       *os.File
	qfileSize   int64
	closeCtx    context.Context
	closeCancel context.CancelFunc
}

type appendReq struct {
	data []byte
	n    int64 // records in data
	keys []keyCount
	err  error
	done chan struct{}
}

// keyCount is a run of records of one key in an Append.
type keyCount struct {
	k     groupKey
	n     int64
	lanes []uint32 // the distinct Lanes of its records with a Key
}

type groupKey struct {
	tenant           uuid.UUID
	queue, partition string
}

type queueKey struct {
	tenant uuid.UUID
	queue  string
}

// routedLanes is r's lane count if it has a Key, else 0.
func routedLanes(r *Record) uint32 {
	if r.Key == "" {
		return 0
	}
	return r.Lanes
}

// addLanesLocked notes that records of k with a Key were routed with lanes.
func (s *Spool) addLanesLocked(k groupKey, lanes uint32) {
	if lanes == 0 {
		return
	}
	if s.lanes == nil {
		s.lanes = make(map[queueKey]map[string][]uint32)
	}
	qk := queueKey{k.tenant, k.queue}
	parts := s.lanes[qk]
	if parts == nil {
		parts = make(map[string][]uint32)
		s.lanes[qk] = parts
	}
	if !slices.Contains(parts[k.partition], lanes) {
		parts[k.partition] = append(parts[k.partition], lanes)
	}
}

// dropLanesLocked forgets k's lane counts: none of its records is pending.
func (s *Spool) dropLanesLocked(k groupKey) {
	qk := queueKey{k.tenant, k.queue}
	if parts := s.lanes[qk]; parts != nil {
		delete(parts, k.partition)
		if len(parts) == 0 {
			delete(s.lanes, qk)
		}
	}
}

// PendingRouted reports a partition of (tenant, queue) with records not
// yet done of which some have a Key and were routed there with a lane count
// n for which route(n) names that partition, and n; ok is false if there is
// none. A caller routing keys to lanes by a count that may change asks it
// with route(n) = the key's lane under n: a key's new records are appended
// behind its pending ones instead of overtaking them. It is cheap when the
// spool is empty.
func (s *Spool) PendingRouted(tenant uuid.UUID, queue string, route func(lanes uint32) string) (partition string, lanes uint32, ok bool) {
	if s.pendingAll.Load() == 0 {
		return "", 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for part, counts := range s.lanes[queueKey{tenant, queue}] {
		for _, n := range counts {
			if route(n) == part && s.keys[groupKey{tenant, queue, part}] > 0 {
				return part, n, true
			}
		}
	}
	return "", 0, false
}

func keyOf(r *Record) groupKey { return groupKey{r.Tenant, r.Queue, r.Partition} }

// addPendLocked changes f's and the spool's count of records not done of k.
func (s *Spool) addPendLocked(f *file, k groupKey, n int64) {
	if n == 0 {
		return
	}
	if f.pend == nil {
		f.pend = make(map[groupKey]int64)
	}
	if f.pend[k] += n; f.pend[k] <= 0 {
		delete(f.pend, k)
	}
	if s.keys == nil {
		s.keys = make(map[groupKey]int64)
	}
	if s.keys[k] += n; s.keys[k] <= 0 {
		delete(s.keys, k)
		delete(s.keyFails, k)
		s.dropLanesLocked(k)
	}
	s.pendingAll.Add(n)
}

// Pending reports whether records of (tenant, queue, partition) were
// appended and are not yet done (stored by Replay, or quarantined). A
// caller that wants per-key order appends a key's new records behind them
// instead of storing them directly. It is cheap when the spool is empty.
func (s *Spool) Pending(tenant uuid.UUID, queue, partition string) bool {
	if s.pendingAll.Load() == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[groupKey{tenant, queue, partition}] > 0
}

// Append makes recs durable: when it returns nil every record is written
// and synced (with the directory entry of a new file), and a later Replay,
// in this process or after a restart, will hand it to the ReplayFunc.
// Records of one Append are stored contiguously and in order.
//
// An error means the records must be treated as not spooled: ErrFull,
// ErrTooLarge and ErrClosed mean nothing was written. After an I/O error, or
// when ctx ends while the write is in progress, some of the records may
// still be replayed later; replay is idempotent through the preserved
// transaction ids, so a caller that reports them failed loses nothing.
func (s *Spool) Append(ctx context.Context, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	size := 0
	for i := range recs {
		n := bodySize(&recs[i])
		if n > MaxRecordSize {
			return fmt.Errorf("%w: record %d has %d bytes, the limit is %d", ErrTooLarge, i, n, MaxRecordSize)
		}
		size += recordHeaderSize + n
	}
	data := make([]byte, 0, size)
	var keys []keyCount
	for i := range recs {
		data = appendRecord(data, &recs[i])
		if k := keyOf(&recs[i]); len(keys) > 0 && keys[len(keys)-1].k == k {
			keys[len(keys)-1].n++
		} else {
			keys = append(keys, keyCount{k: k, n: 1})
		}
		if l := routedLanes(&recs[i]); l != 0 && !slices.Contains(keys[len(keys)-1].lanes, l) {
			keys[len(keys)-1].lanes = append(keys[len(keys)-1].lanes, l)
		}
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if s.total+int64(size) > s.opts.MaxTotalSize {
		total := s.total
		s.mu.Unlock()
		return fmt.Errorf("%w: %d bytes spooled, %d more would pass MaxTotalSize %d", ErrFull, total, size, s.opts.MaxTotalSize)
	}
	s.total += int64(size)
	s.appenders.Add(1)
	s.mu.Unlock()
	defer s.appenders.Done()

	r := &appendReq{data: data, n: int64(len(recs)), keys: keys}
	if s.opts.Sync == SyncEach {
		s.wmu.Lock()
		s.commit([]*appendReq{r})
		s.wmu.Unlock()
		return r.err
	}
	r.done = make(chan struct{})
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		s.unreserve(int64(size))
		return ctx.Err()
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Spool) unreserve(n int64) {
	s.mu.Lock()
	s.total -= n
	s.mu.Unlock()
}

// maxGroupBytes bounds one group commit, so one huge burst does not hold
// every waiter behind a single write.
const maxGroupBytes = 8 << 20

// writer is GroupCommit's single writer: it takes whatever queued up while
// the previous sync ran and commits it with one write and one sync.
func (s *Spool) writer() {
	defer close(s.writerDone)
	batch := make([]*appendReq, 0, 64)
	for r := range s.reqs {
		batch = append(batch[:0], r)
		n := len(r.data)
	drain:
		for n < maxGroupBytes {
			select {
			case r, ok := <-s.reqs:
				if !ok {
					break drain
				}
				batch = append(batch, r)
				n += len(r.data)
			default:
				break drain
			}
		}
		s.wmu.Lock()
		s.commit(batch)
		s.wmu.Unlock()
		for _, r := range batch {
			close(r.done)
		}
		clear(batch)
	}
}

// commit writes reqs in order to the active file, rotating as needed, syncs,
// and sets each request's err. The caller holds wmu.
func (s *Spool) commit(reqs []*appendReq) {
	var err error
	i := 0
	for i < len(reqs) {
		if s.active == nil {
			if s.active, err = s.createFile(); err != nil {
				break
			}
		}
		f := s.active
		buf, j := s.wbuf[:0], i
		for ; j < len(reqs); j++ {
			d := reqs[j].data
			if used := f.size + int64(len(buf)); used > fileHeaderSize && used+int64(len(d)) > s.opts.MaxFileSize {
				break
			}
			buf = append(buf, reqs[j].data...)
		}
		if j == i+1 {
			buf = reqs[i].data // nothing to gather
		}
		if j > i {
			err = s.writeSync(f, buf, reqs[i:j])
			for k := i; k < j; k++ {
				reqs[k].err = err
			}
			i = j
			if j > i+1 && cap(buf) <= maxGroupBytes {
				s.wbuf = buf
			}
			if err != nil {
				break
			}
		}
		if i < len(reqs) {
			s.seal(f) // the next request does not fit: rotate
		}
	}
	if err == nil {
		return
	}
	// Requests not yet written fail with the same error; written ones that
	// failed already carry it. Their reservations are released.
	var failed int64
	for k, r := range reqs {
		if k >= i {
			r.err = err
		}
		if r.err != nil {
			failed += int64(len(r.data))
		}
	}
	s.mu.Lock()
	s.total -= failed
	s.setErrLocked(err)
	s.mu.Unlock()
	s.log.Error("spool: append failed", "dir", s.opts.Dir, "err", err)
}

// writeSync appends buf (the records of reqs) to f and syncs it. On failure it cuts
// the file back to its synced size, because a failed sync may have dropped
// the pages it was meant to write; if even that fails the file is sealed so
// later appends go to a fresh file.
func (s *Spool) writeSync(f *file, buf []byte, reqs []*appendReq) error {
	off := f.size
	_, err := f.w.WriteAt(buf, off)
	if err == nil {
		err = datasync(f.w)
		s.mu.Lock()
		s.fsyncs++
		s.mu.Unlock()
	}
	if err != nil {
		terr := f.w.Truncate(off)
		if terr == nil {
			terr = datasync(f.w)
		}
		if terr != nil {
			s.seal(f)
		}
		return fmt.Errorf("spool: write %s: %w", s.name(f.seq, extData), err)
	}
	s.mu.Lock()
	f.size = off + int64(len(buf))
	for _, r := range reqs {
		f.records += r.n
		s.appended += r.n
		for _, kc := range r.keys {
			s.addPendLocked(f, kc.k, kc.n)
			for _, l := range kc.lanes {
				s.addLanesLocked(kc.k, l)
			}
		}
	}
	s.mu.Unlock()
	return nil
}

// newDataFile creates path (which must not exist) with the file header,
// and syncs it and its directory entry; on failure it leaves nothing.
func (s *Spool) newDataFile(path string) (*os.File, error) {
	w, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err = w.Write(fileHeader[:]); err == nil {
		if err = datasync(w); err == nil {
			err = syncDir(s.opts.Dir)
		}
	}
	if err != nil {
		w.Close()
		os.Remove(path)
		return nil, err
	}
	return w, nil
}

// createFile starts the next data file. Its header and directory entry are
// synced before any record goes in, so an acknowledged record's file cannot
// vanish in a crash. The caller holds wmu.
func (s *Spool) createFile() (*file, error) {
	seq := s.nextSeq
	s.nextSeq++
	path := s.path(seq, extData)
	w, err := s.newDataFile(path)
	if err != nil {
		return nil, fmt.Errorf("spool: create %s: %w", filepath.Base(path), err)
	}
	f := &file{seq: seq, size: fileHeaderSize, acked: fileHeaderSize, w: w, marks: make(map[int64]int64), pend: make(map[groupKey]int64)}
	s.mu.Lock()
	s.files = append(s.files, f)
	s.total += fileHeaderSize
	s.mu.Unlock()
	return f, nil
}

// seal ends appends to f. The caller holds wmu.
func (s *Spool) seal(f *file) {
	if f.w != nil {
		f.w.Close()
		f.w = nil
	}
	s.mu.Lock()
	f.sealed = true
	s.mu.Unlock()
	if s.active == f {
		s.active = nil
	}
}

func (s *Spool) setErrLocked(err error) {
	s.lastErr, s.lastErrAt = err, time.Now()
}

// Stats returns a snapshot of the spool's counters.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Files:              len(s.files),
		TotalBytes:         s.total,
		Appended:           s.appended,
		Fsyncs:             s.fsyncs,
		Replayed:           s.replayed,
		QuarantinedFiles:   s.qFiles,
		QuarantinedBytes:   s.qBytes,
		QuarantinedRecords: s.qRecords,
		TornTails:          s.tornTails,
		LastError:          s.lastErr,
		LastErrorAt:        s.lastErrAt,
	}
	for _, f := range s.files {
		st.PendingRecords += f.records - f.doneRecs
		st.PendingBytes += max(f.size-fileHeaderSize, 0) - f.doneBytes
	}
	return st
}

// Close waits for Appends in progress, cancels a running Replay (its
// ReplayFunc sees its context cancelled) and waits for it to return, closes
// the files and releases the directory. It deletes files that are fully
// replayed; everything else stays for the next Open. No goroutine of the
// spool outlives Close. Calls after the first return nil.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()

	s.closeCancel()
	s.appenders.Wait()
	if s.reqs != nil {
		close(s.reqs)
		<-s.writerDone
	}

	s.replayMu.Lock()
	defer s.replayMu.Unlock()
	s.wmu.Lock()
	if s.active != nil {
		s.seal(s.active)
	}
	s.wmu.Unlock()
	var errs []error
	s.mu.Lock()
	files := slices.Clone(s.files)
	s.mu.Unlock()
	for _, f := range files {
		s.mu.Lock()
		done := f.acked == f.size && f.corrupt == nil
		s.mu.Unlock()
		if done {
			errs = append(errs, s.retire(f))
		}
	}
	s.qmu.Lock()
	if s.qfile != nil {
		errs = append(errs, s.qfile.Close())
		s.qfile = nil
	}
	s.qmu.Unlock()
	errs = append(errs, unlockDir(s.lock))
	return errors.Join(errs...)
}

// Dir is the directory this spool owns.
func (s *Spool) Dir() string { return s.opts.Dir }
