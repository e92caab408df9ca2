package spool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
)

// ReplayFunc pushes one batch of records, all of the same (tenant, queue,
// partition) and in spool order, and reports how many of them, counted from
// the start of the batch, are stored (a duplicate counts as stored). It
// returns len(batch), nil when the whole batch is stored; otherwise stored <
// len(batch) and err says why the rest was not: wrap it with Permanent when
// retrying cannot help. A result of stored < len(batch) with a nil err is
// treated as a transient failure; err is ignored when stored == len(batch).
//
// The records it reports stored are confirmed (durably) and never offered
// again; the others are offered again in a later pass, in order, before
// any later record of their key. So fn must report exactly what it stored:
// a record stored but reported failed is stored twice unless fn is
// idempotent per TransactionID. Once fn has started storing a batch it
// should let that finish and report it even if ctx ends, since what it does
// not report is offered again. It is called from several goroutines at once
// (for different keys) unless Options.ReplayConcurrency is 1, and its ctx
// is cancelled when Replay's ctx ends or Close begins. fn may keep the batch
// and its payloads.
type ReplayFunc func(ctx context.Context, batch []Record) (stored int, err error)

// Permanent marks err as a failure that retrying cannot fix (for example,
// the queue no longer accepts the record). A record whose replay fails with
// a permanent error in Options.QuarantineAfter passes is quarantined on its
// own. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// errIncomplete stands in when fn stored less than the batch without saying why.
var errIncomplete = errors.New("spool: replay function stored only part of a batch and returned no error")

// Replay makes one pass over the records not yet done, oldest file first,
// in order. It reads them in chunks (Options.ReplayBatchRecords and
// ReplayBatchBytes), splits each chunk by key (tenant, queue, partition) in
// first-appearance order and calls fn once per key, up to
// Options.ReplayConcurrency keys at once, so each key's records reach fn in
// the order they were appended. As soon as fn returns, the records it
// stored are marked done in the file's ack file (synced, shared between the
// calls that return meanwhile); the next pass, in this process or after a
// restart, skips them. So a record is offered again only if the process
// dies between fn storing it and that sync.
//
// A key whose call fails is left alone for the rest of the pass: its
// records stay pending, in order, and none of its later records is offered
// before them. The other keys go on, unless calls keep failing with no
// success in between (2 × ReplayConcurrency in a row, as when the database
// is down), which ends the pass (a call still running that then succeeds does
// not revive it). A Permanent failure of the same key in
// QuarantineAfter passes (a success of the key starts the count again)
// quarantines the record it failed at on its own: the record is appended to
// a *.spool.quarantine file, logged, counted in Stats.QuarantinedRecords and
// marked done, and the key goes on; while the key keeps failing permanently
// each further record it fails at is quarantined at once. A file found
// corrupt is quarantined whole once every record before the corruption is
// done.
//
// A file is deleted once every record in it is done (the file being
// appended to is then rotated first). The file being appended to is
// replayed up to what was synced when the pass reached it. Replay returns
// the number of records this pass confirmed and the first failure of fn (or
// I/O error) it met, nil when every key it looked at went through.
//
// Replay is safe to call concurrently with Append. Calls are serialized.
// The caller runs it from a loop with backoff; it returns ErrClosed after
// Close.
func (s *Spool) Replay(ctx context.Context, fn ReplayFunc) (int, error) {
	s.replayMu.Lock()
	defer s.replayMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, ErrClosed
	}
	files := slices.Clone(s.files)
	s.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.closeCtx, cancel)()

	p := &pass{blocked: map[groupKey]bool{}, limit: 2 * s.opts.ReplayConcurrency, counted: map[groupKey]bool{}}
	total := 0
	for _, f := range files {
		n, err := s.replayFile(ctx, f, fn, p)
		total += n
		if err != nil {
			p.halt(err)
		}
		if ctx.Err() != nil || p.halted() {
			break
		}
	}
	if err := p.result(); err != nil {
		return total, err
	}
	return total, ctx.Err()
}

// pass is the state of one Replay pass shared by its workers.
type pass struct {
	mu      sync.Mutex
	blocked map[groupKey]bool // keys that failed in this pass
	counted map[groupKey]bool // keys whose permanent failure was counted in this pass
	first   error             // the first failure of fn
	fatal   error             // an I/O error of the spool: the pass stops
	streak  int               // failures since the last success
	limit   int
	// stopped: streak reached limit. It stays set, since workers skipped
	// keys then without blocking them: a call still running that succeeds
	// afterwards must not let the pass go on to their later records.
	stopped bool
}

func (p *pass) isBlocked(k groupKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocked[k]
}

func (p *pass) failed(k groupKey, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked[k] = true
	if p.first == nil {
		p.first = err
	}
	p.streak++
	if p.streak >= p.limit {
		p.stopped = true
	}
}

func (p *pass) succeeded() {
	p.mu.Lock()
	p.streak = 0
	p.mu.Unlock()
}

func (p *pass) halt(err error) {
	p.mu.Lock()
	if p.fatal == nil {
		p.fatal = err
	}
	p.mu.Unlock()
}

func (p *pass) halted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fatal != nil || p.stopped
}

func (p *pass) result() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fatal != nil {
		return p.fatal
	}
	return p.first
}

func (s *Spool) replayFile(ctx context.Context, f *file, fn ReplayFunc, p *pass) (done int, err error) {
	s.mu.Lock()
	end, pos, corrupt := f.size, f.acked, f.corrupt
	s.mu.Unlock()
	stopAt := end // where the valid records end

	if pos < end {
		rf, err := os.Open(s.path(f.seq, extData))
		if err != nil {
			return 0, s.ioErr(err)
		}
		defer rf.Close()
		aw := &ackWriter{s: s, f: f}
		aw.cond.L = &aw.mu
		defer aw.close()
		for pos < end {
			if err := ctx.Err(); err != nil {
				return done, err
			}
			if p.halted() {
				return done, nil
			}
			recs, ends, rerr := readChunk(rf, pos, end, s.opts.ReplayBatchRecords, s.opts.ReplayBatchBytes)
			if rerr != nil && !errors.Is(rerr, ErrCorrupt) {
				return done, s.ioErr(rerr)
			}
			if len(recs) > 0 {
				done += s.deliver(ctx, f, aw, pos, recs, ends, fn, p)
				pos = ends[len(ends)-1]
				if err := s.advance(f, aw); err != nil {
					return done, err
				}
			}
			if rerr != nil {
				// The file changed after it was validated (bit rot, or
				// someone else wrote to it): quarantine it from here.
				corrupt = fmt.Errorf("spool: %s at offset %d: %w", s.name(f.seq, extData), pos, rerr)
				stopAt = pos
				s.mu.Lock()
				f.corrupt = corrupt
				s.mu.Unlock()
				break
			}
		}
		aw.close()
	}
	s.mu.Lock()
	allDone := f.acked >= stopAt
	s.mu.Unlock()
	if corrupt != nil {
		if !allDone {
			return done, nil // records before the corruption are still to come
		}
		return done, s.quarantine(f, corrupt)
	}
	// A fully replayed file goes, even the one being appended to (the next
	// Append starts a new file): its bytes would otherwise keep counting
	// against MaxTotalSize. wmu keeps an append from slipping in between.
	s.wmu.Lock()
	s.mu.Lock()
	finished := f.acked == f.size && f.corrupt == nil
	s.mu.Unlock()
	if finished && s.active == f {
		s.seal(f)
	}
	s.wmu.Unlock()
	if finished {
		return done, s.retire(f)
	}
	return done, nil
}

// advance moves f's prefix over the done records at its start and records
// the new prefix, so marks do not pile up in memory.
func (s *Spool) advance(f *file, aw *ackWriter) error {
	s.mu.Lock()
	from := f.acked
	for e, ok := f.marks[f.acked]; ok; e, ok = f.marks[f.acked] {
		delete(f.marks, f.acked)
		f.acked = e
	}
	to := f.acked
	s.mu.Unlock()
	if to == from {
		return nil
	}
	return aw.write(appendAckEntry(nil, to))
}

type group struct {
	k     groupKey
	idx   []int // positions in the chunk
	batch []Record
}

// deliver hands the records of a chunk that are not done, and whose key did
// not fail earlier in the pass, to fn, one call per key, and marks what it
// stored. start is the offset of the chunk's first record, ends the offset
// past each. It returns the number of records confirmed.
func (s *Spool) deliver(ctx context.Context, f *file, aw *ackWriter, start int64, recs []Record, ends []int64, fn ReplayFunc, p *pass) int {
	starts := make([]int64, len(recs))
	starts[0] = start
	copy(starts[1:], ends)
	byKey := map[groupKey]*group{}
	var groups []*group
	s.mu.Lock()
	for i := range recs {
		if f.isDoneLocked(starts[i]) {
			continue
		}
		k := keyOf(&recs[i])
		g := byKey[k]
		if g == nil {
			g = &group{k: k}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.batch = append(g.batch, recs[i])
	}
	s.mu.Unlock()

	var next, confirmed atomic.Int64
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= len(groups) || ctx.Err() != nil || p.halted() {
				return
			}
			g := groups[i]
			if p.isBlocked(g.k) {
				continue
			}
			confirmed.Add(int64(s.replayGroup(ctx, f, aw, g, starts, ends, fn, p)))
		}
	}
	if workers := min(s.opts.ReplayConcurrency, len(groups)); workers <= 1 {
		work()
	} else {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(work)
		}
		wg.Wait()
	}
	return int(confirmed.Load())
}

// replayGroup runs fn on one key's records of a chunk, marks what it stored
// and handles a failure. It returns the number of records marked stored.
func (s *Spool) replayGroup(ctx context.Context, f *file, aw *ackWriter, g *group, starts, ends []int64, fn ReplayFunc, p *pass) int {
	confirmed := 0
	batch, idx := g.batch, g.idx
	for len(batch) > 0 {
		n, err := fn(ctx, batch)
		n = min(max(n, 0), len(batch))
		if n < len(batch) && err == nil {
			err = errIncomplete
		}
		if n > 0 {
			cerr := s.markDone(f, aw, g.k, idx[:n], starts, ends, true)
			confirmed += n
			s.mu.Lock()
			delete(s.keyFails, g.k)
			s.mu.Unlock()
			p.succeeded()
			if cerr != nil {
				p.halt(cerr)
				return confirmed
			}
		}
		if n == len(batch) {
			return confirmed
		}
		s.mu.Lock()
		s.setErrLocked(err)
		s.mu.Unlock()
		if !IsPermanent(err) || !s.countPermanent(g.k, p) {
			if IsPermanent(err) {
				s.log.Warn("spool: replay failed permanently; will retry before quarantining the record",
					"file", s.name(f.seq, extData), "offset", starts[idx[n]], "queue", g.k.queue, "partition", g.k.partition, "err", err)
			}
			p.failed(g.k, err)
			return confirmed
		}
		if qerr := s.quarantineRecord(f, aw, g.k, &batch[n], starts[idx[n]], ends[idx[n]], err); qerr != nil {
			p.halt(qerr)
			return confirmed
		}
		batch, idx = batch[n+1:], idx[n+1:]
	}
	return confirmed
}

// countPermanent counts a permanent failure of k (once per pass) and
// reports whether k has now failed permanently in QuarantineAfter passes.
func (s *Spool) countPermanent(k groupKey, p *pass) bool {
	p.mu.Lock()
	first := !p.counted[k]
	p.counted[k] = true
	p.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if first {
		s.keyFails[k]++
	}
	return s.keyFails[k] >= s.opts.QuarantineAfter
}

// markDone records the records at positions idx of the chunk (all of key k)
// as done: durably in the ack file, then in memory. The memory is updated
// even if the sync fails, since the records were stored all the same.
func (s *Spool) markDone(f *file, aw *ackWriter, k groupKey, idx []int, starts, ends []int64, stored bool) error {
	entries := make([]byte, 0, len(idx)*ackEntrySize)
	for _, i := range idx {
		entries = appendAckMark(entries, starts[i])
	}
	err := aw.write(entries)
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, i := range idx {
		if f.isDoneLocked(starts[i]) {
			continue
		}
		if f.marks == nil {
			f.marks = make(map[int64]int64)
		}
		f.marks[starts[i]] = ends[i]
		f.doneRecs++
		f.doneBytes += ends[i] - starts[i]
		n++
	}
	s.addPendLocked(f, k, -n)
	if stored {
		s.replayed += n
	}
	return err
}

// ackWriter appends entries to one data file's ack file and syncs them.
// Concurrent writers share a sync: whoever finds no sync running writes and
// syncs everything queued so far.
type ackWriter struct {
	s *Spool
	f *file

	mu     sync.Mutex
	cond   sync.Cond
	fd     *os.File
	buf    []byte
	queued uint64 // write calls so far
	synced uint64 // write calls whose entries are synced (or failed)
	busy   bool
	err    error // sticky: after a failed write nothing more is trusted
}

func (a *ackWriter) write(entries []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	a.buf = append(a.buf, entries...)
	a.queued++
	me := a.queued
	for a.synced < me {
		if a.busy {
			a.cond.Wait()
			continue
		}
		a.busy = true
		data, upto := a.buf, a.queued
		a.buf = nil
		a.mu.Unlock()
		err := a.flush(data)
		a.mu.Lock()
		a.busy, a.synced = false, upto
		if err != nil && a.err == nil {
			a.err = a.s.ioErr(err)
		}
		a.cond.Broadcast()
	}
	return a.err
}

// flush writes data at the end of the valid entries and syncs. A failed
// write does not move that end, so the next one overwrites what it left.
func (a *ackWriter) flush(data []byte) error {
	if a.fd == nil {
		path := a.s.path(a.f.seq, extAck)
		_, statErr := os.Stat(path)
		fd, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		if statErr != nil {
			// A new ack file's directory entry must survive a crash too.
			if err := syncDir(a.s.opts.Dir); err != nil {
				fd.Close()
				return err
			}
		}
		a.fd = fd
	}
	if _, err := a.fd.WriteAt(data, a.f.ackSize); err != nil {
		return err
	}
	if err := datasync(a.fd); err != nil {
		return err
	}
	a.f.ackSize += int64(len(data))
	return nil
}

func (a *ackWriter) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fd != nil {
		a.fd.Close()
		a.fd = nil
	}
}

// quarantineRecord appends r (the record at [start, end) of f, of key k) to
// this run's quarantine file, logs it and marks it done in f.
func (s *Spool) quarantineRecord(f *file, aw *ackWriter, k groupKey, r *Record, start, end int64, cause error) error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.qfile == nil {
		s.wmu.Lock()
		seq := s.nextSeq
		s.nextSeq++
		s.wmu.Unlock()
		w, err := s.newDataFile(s.path(seq, extData+extQuar))
		if err != nil {
			return s.ioErr(err)
		}
		s.qfile, s.qfileSize = w, fileHeaderSize
		s.mu.Lock()
		s.qFiles++
		s.qBytes += fileHeaderSize
		s.mu.Unlock()
	}
	data := appendRecord(nil, r)
	if _, err := s.qfile.WriteAt(data, s.qfileSize); err != nil {
		return s.ioErr(err)
	}
	if err := datasync(s.qfile); err != nil {
		return s.ioErr(err)
	}
	qname := filepath.Base(s.qfile.Name())
	s.qfileSize += int64(len(data))
	s.mu.Lock()
	s.qBytes += int64(len(data))
	s.qRecords++
	s.setErrLocked(fmt.Errorf("spool: record at offset %d of %s quarantined to %s: %w", start, s.name(f.seq, extData), qname, cause))
	s.mu.Unlock()
	s.log.Error("spool: record quarantined; it needs an operator",
		"file", s.name(f.seq, extData), "offset", start, "quarantine_file", qname,
		"queue", r.Queue, "partition", r.Partition, "transaction_id", r.TransactionID, "cause", cause)
	i := []int{0}
	return s.markDone(f, aw, k, i, []int64{start}, []int64{end}, false)
}

// readChunk reads the records in [off, end) of r, up to maxRecs records and
// about maxBytes bytes (at least one record). It returns them with the file
// offset just past each. end is a record boundary validated earlier, so any
// record that does not decode is corruption: readChunk returns the records
// before it and an error wrapping ErrCorrupt. Every chunk has its own
// buffer, so the records stay valid after the next call.
func readChunk(r io.ReaderAt, off, end int64, maxRecs, maxBytes int) ([]Record, []int64, error) {
	buf := make([]byte, min(end-off, int64(maxBytes)))
	if err := readFull(r, buf, off); err != nil {
		return nil, nil, err
	}
	if n, err := recordLen(buf); err == nil && n > len(buf) && off+int64(n) <= end {
		// The first record is larger than a chunk: read it whole.
		buf = make([]byte, n)
		if err := readFull(r, buf, off); err != nil {
			return nil, nil, err
		}
	}
	var recs []Record
	var ends []int64
	p := 0
	for p < len(buf) && len(recs) < maxRecs {
		rec, n, err := decodeRecord(buf[p:])
		if errors.Is(err, errShort) && len(recs) > 0 && off+int64(len(buf)) < end {
			if rn, lerr := recordLen(buf[p:]); lerr != nil || off+int64(p+rn) <= end {
				break // the chunk boundary cut this record: it starts the next chunk
			}
		}
		if err != nil {
			return recs, ends, fmt.Errorf("offset %d: %w", off+int64(p), err)
		}
		recs = append(recs, rec)
		p += n
		ends = append(ends, off+int64(p))
	}
	return recs, ends, nil
}

// readFull reads len(buf) bytes at off. A short file is corruption: the
// bytes were there when the file was validated.
func readFull(r io.ReaderAt, buf []byte, off int64) error {
	n, err := r.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == io.EOF {
		return fmt.Errorf("%w: file shorter than its validated size", ErrCorrupt)
	}
	return err
}

// ioErr records an I/O error in Stats and returns it.
func (s *Spool) ioErr(err error) error {
	err = fmt.Errorf("spool: %w", err)
	s.mu.Lock()
	s.setErrLocked(err)
	s.mu.Unlock()
	s.log.Error("spool: replay I/O error", "dir", s.opts.Dir, "err", err)
	return err
}

// quarantine takes f out of replay: it stops appends to it, renames it and
// its ack file to *.quarantine, and counts it. An operator can inspect it,
// and re-drive it by renaming both back and reopening the spool.
func (s *Spool) quarantine(f *file, cause error) error {
	s.wmu.Lock()
	if s.active == f {
		s.seal(f)
	}
	s.wmu.Unlock()
	data := s.path(f.seq, extData)
	if err := os.Rename(data, data+extQuar); err != nil {
		return s.ioErr(err)
	}
	if err := os.Rename(s.path(f.seq, extAck), s.path(f.seq, extAck)+extQuar); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("spool: quarantine ack file", "err", err)
	}
	if err := syncDir(s.opts.Dir); err != nil {
		s.log.Error("spool: sync directory", "err", err)
	}
	var size int64
	if fi, err := os.Stat(data + extQuar); err == nil {
		size = fi.Size()
	}
	s.mu.Lock()
	s.dropLocked(f)
	s.qFiles++
	s.qBytes += size
	s.setErrLocked(cause)
	lost := f.records - f.doneRecs
	for k, n := range f.pend {
		s.addPendLocked(f, k, -n)
	}
	s.mu.Unlock()
	s.log.Error("spool: file quarantined; its unreplayed records need an operator",
		"file", s.name(f.seq, extData)+extQuar, "unreplayed_records", lost, "cause", cause)
	return nil
}

// retire deletes a fully replayed, sealed file. Losing the deletion in a
// crash is harmless: its ack file says it is done, and Open removes it.
func (s *Spool) retire(f *file) error {
	if err := s.removeFiles(f.seq); err != nil {
		return s.ioErr(err)
	}
	s.mu.Lock()
	s.dropLocked(f)
	s.mu.Unlock()
	return nil
}

func (s *Spool) dropLocked(f *file) {
	if i := slices.Index(s.files, f); i >= 0 {
		s.files = slices.Delete(s.files, i, i+1)
		s.total -= f.size
	}
}
