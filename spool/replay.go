package spool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gofrs/uuid/v5"
)

// ReplayFunc pushes one batch of records, all of the same (tenant, queue,
// partition) and in spool order, and reports how many of them, counted from
// the start of the batch, are stored (a duplicate counts as stored). It
// returns len(batch), nil when the whole batch is stored; otherwise stored <
// len(batch) and err says why the rest was not: wrap it with Permanent when
// retrying cannot help. A result of stored < len(batch) with a nil err is
// treated as a transient failure; err is ignored when stored == len(batch).
//
// Records after the first one not stored are offered again later even if
// they were stored, so fn must be idempotent per TransactionID (queue
// dedup). fn may keep the batch and its payloads. It is called from several
// goroutines at once (for different keys) unless Options.ReplayConcurrency
// is 1, and its ctx is cancelled when Replay's ctx ends or Close begins.
type ReplayFunc func(ctx context.Context, batch []Record) (stored int, err error)

// Permanent marks err as a failure that retrying cannot fix (for example,
// the queue no longer accepts the record). A file whose replay fails with a
// permanent error at the same record in Options.QuarantineAfter passes in a
// row is quarantined. Permanent(nil) is nil.
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

// Replay makes one pass over the records not yet replayed, oldest file
// first, in order. It reads them in chunks (Options.ReplayBatchRecords and
// ReplayBatchBytes), splits each chunk by (tenant, queue, partition) in
// first-appearance order and calls fn once per key, so each key's records
// reach fn in the order they were appended. After a chunk it records, durably
// and per file, the offset below which every record was stored (the
// confirmed prefix of the chunk); the next pass, in this process or after a
// restart, resumes there. So a crash or failure mid-replay repeats at most
// one chunk's unconfirmed records, and never skips an unconfirmed one.
//
// A file is deleted once every record in it is confirmed (the file being
// appended to is then rotated first). The file being appended to is replayed
// up to what was synced when the pass reached it. The pass stops at the first failure and returns it,
// with the number of records confirmed by this pass. A Permanent failure at
// the same record in QuarantineAfter passes in a row quarantines the file
// (renamed to *.quarantine, with its ack file) and the pass goes on with the
// next file; so does corruption found in a file. Both are logged and counted
// in Stats, and Replay then returns no error for them.
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

	total := 0
	for _, f := range files {
		n, err := s.replayFile(ctx, f, fn)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func (s *Spool) replayFile(ctx context.Context, f *file, fn ReplayFunc) (done int, err error) {
	s.mu.Lock()
	end, acked, corrupt := f.size, f.acked, f.corrupt
	s.mu.Unlock()

	if acked < end {
		rf, err := os.Open(s.path(f.seq, extData))
		if err != nil {
			return 0, s.ioErr(err)
		}
		defer rf.Close()
		var ack *os.File
		defer func() {
			if ack != nil {
				ack.Close()
			}
		}()
		for acked < end {
			if err := ctx.Err(); err != nil {
				return done, err
			}
			recs, ends, rerr := readChunk(rf, acked, end, s.opts.ReplayBatchRecords, s.opts.ReplayBatchBytes)
			if rerr != nil && !errors.Is(rerr, ErrCorrupt) {
				return done, s.ioErr(rerr)
			}
			if len(recs) > 0 {
				start := acked
				k, errAt, ferr := s.deliver(ctx, recs, fn)
				if k > 0 {
					if ack == nil {
						if ack, err = os.OpenFile(s.path(f.seq, extAck), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err != nil {
							return done, s.ioErr(err)
						}
					}
					if err := writeAck(ack, ends[k-1]); err != nil {
						// The records are stored but not confirmed: the next
						// pass offers them again, which dedup absorbs.
						return done, s.ioErr(err)
					}
					acked = ends[k-1]
					done += k
					s.mu.Lock()
					f.acked = acked
					f.ackedRecs += int64(k)
					s.replayed += int64(k)
					s.mu.Unlock()
				}
				if ferr != nil {
					failedAt := start
					if errAt > 0 {
						failedAt = ends[errAt-1]
					}
					// nil means f was quarantined and the pass goes on.
					return done, s.replayFailed(f, failedAt, ferr)
				}
			}
			if rerr != nil {
				// The file changed after it was validated (bit rot, or
				// someone else wrote to it): quarantine it from here.
				corrupt = fmt.Errorf("spool: %s at offset %d: %w", s.name(f.seq, extData), acked, rerr)
				s.mu.Lock()
				f.corrupt = corrupt
				s.mu.Unlock()
				break
			}
		}
	}
	if corrupt != nil {
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

// replayFailed counts a failure at the record at offset at against f and
// quarantines f when that record failed permanently QuarantineAfter times in
// a row. It returns the error that ends the pass, or nil when f was
// quarantined and the pass goes on.
func (s *Spool) replayFailed(f *file, at int64, err error) error {
	s.mu.Lock()
	s.setErrLocked(err)
	s.mu.Unlock()
	if !IsPermanent(err) {
		return err
	}
	if f.attemptsAt != at {
		f.attempts, f.attemptsAt = 0, at
	}
	f.attempts++
	if f.attempts < s.opts.QuarantineAfter {
		s.log.Warn("spool: replay failed permanently; will retry before quarantining",
			"file", s.name(f.seq, extData), "offset", at, "attempt", f.attempts, "of", s.opts.QuarantineAfter, "err", err)
		return err
	}
	cause := fmt.Errorf("spool: %s at offset %d: replay failed %d times: %w", s.name(f.seq, extData), at, f.attempts, err)
	if qerr := s.quarantine(f, cause); qerr != nil {
		return qerr
	}
	return nil
}

type groupKey struct {
	tenant           uuid.UUID
	queue, partition string
}

type group struct {
	idx    []int // positions in the chunk
	batch  []Record
	stored int
	err    error
}

// deliver hands a chunk to fn, one call per key, and returns the confirmed
// prefix (the number of leading records of the chunk that are stored), and
// the position and error of the earliest record fn failed.
func (s *Spool) deliver(ctx context.Context, recs []Record, fn ReplayFunc) (prefix, errAt int, err error) {
	byKey := map[groupKey]*group{}
	var groups []*group
	for i, r := range recs {
		k := groupKey{r.Tenant, r.Queue, r.Partition}
		g := byKey[k]
		if g == nil {
			g = &group{}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.batch = append(g.batch, r)
	}

	// Workers take groups in order; after a failure nobody starts a new
	// group, since its records could not be confirmed anyway.
	var next atomic.Int64
	var failed atomic.Bool
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= len(groups) || failed.Load() {
				return
			}
			g := groups[i]
			n, err := fn(ctx, g.batch)
			g.stored = min(max(n, 0), len(g.batch))
			if g.stored < len(g.batch) {
				g.err = err
				if g.err == nil {
					g.err = errIncomplete
				}
				failed.Store(true)
			}
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

	prefix, errAt = len(recs), len(recs)
	for _, g := range groups {
		if g.stored == len(g.batch) {
			continue
		}
		first := g.idx[g.stored]
		prefix = min(prefix, first)
		if g.err != nil && first < errAt {
			errAt, err = first, g.err
		}
	}
	return prefix, errAt, err
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

func writeAck(f *os.File, off int64) error {
	if _, err := f.Write(appendAckEntry(nil, off)); err != nil {
		return err
	}
	return datasync(f)
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
	lost := f.records - f.ackedRecs
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
