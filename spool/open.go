package spool

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// File name extensions; every file is named by its 16-hex-digit sequence
// number plus one of them.
const (
	extData   = ".spool"
	extAck    = ".ack"
	extQuar   = ".quarantine" // appended to a quarantined .spool or .ack
	lockName  = "LOCK"
	seqDigits = 16
)

func (s *Spool) name(seq uint64, ext string) string {
	return fmt.Sprintf("%0*x%s", seqDigits, seq, ext)
}

func (s *Spool) path(seq uint64, ext string) string {
	return filepath.Join(s.opts.Dir, s.name(seq, ext))
}

// parseName splits a spool file name into its sequence number and
// extension (".spool", ".ack", ".spool.quarantine", ".ack.quarantine").
func parseName(name string) (seq uint64, ext string, ok bool) {
	if len(name) <= seqDigits {
		return 0, "", false
	}
	seq, err := strconv.ParseUint(name[:seqDigits], 16, 64)
	if err != nil {
		return 0, "", false
	}
	ext = name[seqDigits:]
	switch ext {
	case extData, extAck, extData + extQuar, extAck + extQuar:
		return seq, ext, true
	}
	return 0, "", false
}

// Open opens (or creates) the spool in o.Dir and takes its lock. It scans
// the data files a previous run left: a torn tail of the newest file (an
// append that was in progress when the process or machine died, hence never
// acknowledged) is cut off; corruption anywhere else is kept and reported,
// and Replay quarantines the file at that point after replaying the records
// before it. New appends always go to a new file.
//
// The directory is created 0700 if missing. Open fails with ErrUnsafeDir
// when it (or a symlink to it) belongs to another user or is writable by
// group or others, or when a spool file in it belongs to another user: a
// spool in a shared directory such as /tmp must not replay records that
// someone else put there.
func Open(o Options) (*Spool, error) {
	if o.Dir == "" {
		return nil, errors.New("spool: Options.Dir is empty")
	}
	o = o.withDefaults()
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if err := checkDir(o.Dir); err != nil {
		return nil, err
	}
	lock, err := lockDir(filepath.Join(o.Dir, lockName))
	if err != nil {
		return nil, err
	}
	s := &Spool{opts: o, log: o.Logger, lock: lock, keys: make(map[groupKey]int64), keyFails: make(map[groupKey]int)}
	if err := s.load(); err != nil {
		unlockDir(lock)
		return nil, err
	}
	s.closeCtx, s.closeCancel = context.WithCancel(context.Background())
	if o.Sync == GroupCommit {
		s.reqs = make(chan *appendReq, 256)
		s.writerDone = make(chan struct{})
		go s.writer()
	}
	if st := s.Stats(); st.Files > 0 || st.QuarantinedFiles > 0 {
		s.log.Info("spool: opened with files from a previous run", "dir", o.Dir,
			"files", st.Files, "pending_records", st.PendingRecords, "quarantined_files", st.QuarantinedFiles)
	}
	return s, nil
}

// load scans Dir and builds the file list.
func (s *Spool) load() error {
	entries, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	var data []uint64
	acks := map[uint64]bool{}
	for _, e := range entries {
		seq, ext, ok := parseName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if fi, err := e.Info(); err != nil {
			return fmt.Errorf("spool: %w", err)
		} else if err := checkOwner(filepath.Join(s.opts.Dir, e.Name()), fi); err != nil {
			return err
		}
		s.nextSeq = max(s.nextSeq, seq+1)
		switch ext {
		case extData:
			data = append(data, seq)
		case extAck:
			acks[seq] = true
		case extData + extQuar:
			s.qFiles++
			if fi, err := e.Info(); err == nil {
				s.qBytes += fi.Size()
			}
		}
	}
	if s.nextSeq == 0 {
		s.nextSeq = 1
	}
	slices.Sort(data)
	dirty := false
	for i, seq := range data {
		delete(acks, seq)
		keep, changed, err := s.loadFile(seq, i == len(data)-1)
		if err != nil {
			return err
		}
		dirty = dirty || changed
		if !keep {
			dirty = true
			if err := s.removeFiles(seq); err != nil {
				return err
			}
		}
	}
	// An ack file without its data file: the data file was deleted after a
	// full replay and the process died before the ack file followed.
	for seq := range acks {
		dirty = true
		if err := os.Remove(s.path(seq, extAck)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("spool: %w", err)
		}
	}
	if dirty {
		if err := syncDir(s.opts.Dir); err != nil {
			return fmt.Errorf("spool: sync directory: %w", err)
		}
	}
	return nil
}

// loadFile scans one data file left by a previous run. keep is false when
// the file holds nothing to replay and should be removed; changed when it
// was truncated.
func (s *Spool) loadFile(seq uint64, newest bool) (keep, changed bool, err error) {
	name := s.name(seq, extData)
	ack, err := readAck(s.path(seq, extAck))
	if err != nil {
		return false, false, err
	}
	f := &file{seq: seq, sealed: true, marks: make(map[int64]int64), pend: make(map[groupKey]int64), ackSize: ack.size}
	// lanes: the lane counts of the pending records with a Key, per key.
	lanes := map[groupKey][]uint32{}
	// Records past the prefix are done if marked, else pending for their key.
	visit := func(start, end int64, body []byte) {
		if end <= ack.prefix {
			return
		}
		if _, ok := ack.marks[start]; ok {
			f.marks[start] = end
			f.doneRecs++
			f.doneBytes += end - start
			return
		}
		var r Record
		if parseBody(body, &r) == nil {
			f.pend[keyOf(&r)]++
			if l := routedLanes(&r); l != 0 && !slices.Contains(lanes[keyOf(&r)], l) {
				lanes[keyOf(&r)] = append(lanes[keyOf(&r)], l)
			}
		}
	}
	sc, err := scanFile(s.path(seq, extData), ack.prefix, visit)
	if err != nil {
		return false, false, err
	}
	f.size, f.records, f.acked = sc.end, sc.records, sc.ackEnd
	f.doneRecs += sc.ackRecs
	f.doneBytes += max(sc.ackEnd-fileHeaderSize, 0)
	for e, ok := f.marks[f.acked]; ok; e, ok = f.marks[f.acked] {
		delete(f.marks, f.acked)
		f.acked = e
	}
	if sc.fault != nil {
		// Only the newest file can hold an append that was cut short: every
		// older one was fully synced before its successor was created, and
		// Open truncates the torn tail it finds before creating another.
		if newest && sc.torn {
			if sc.end < fileHeaderSize {
				s.log.Warn("spool: removing a data file whose creation was cut short", "file", name)
				return false, true, nil
			}
			s.log.Warn("spool: cutting a torn tail (an append that never completed)",
				"file", name, "offset", sc.end, "dropped_bytes", sc.size-sc.end, "cause", sc.fault)
			if err := truncateSync(s.path(seq, extData), sc.end); err != nil {
				return false, false, fmt.Errorf("spool: truncate torn tail of %s: %w", name, err)
			}
			s.tornTails++
			changed = true
		} else {
			f.corrupt = fmt.Errorf("spool: %s at offset %d: %w", name, sc.end, sc.fault)
			if sc.end < fileHeaderSize {
				f.size, f.acked = fileHeaderSize, fileHeaderSize
			}
			s.log.Error("spool: corrupt data file; its records before the corruption will be replayed and the file quarantined",
				"file", name, "offset", sc.end, "records_before", sc.records, "err", sc.fault)
			s.setErrLocked(f.corrupt)
		}
	}
	if f.corrupt == nil && f.acked == f.size {
		return false, changed, nil // empty or fully replayed
	}
	s.files = append(s.files, f)
	s.total += f.size
	for k, n := range f.pend {
		s.keys[k] += n
		s.pendingAll.Add(n)
	}
	for k, ls := range lanes {
		for _, l := range ls {
			s.addLanesLocked(k, l)
		}
	}
	return true, changed, nil
}

// removeFiles deletes a data file and then its ack file: a crash between the
// two leaves an orphan ack file (harmless, removed by Open), never a data
// file that lost its replay offset.
func (s *Spool) removeFiles(seq uint64) error {
	for _, ext := range []string{extData, extAck} {
		if err := os.Remove(s.path(seq, ext)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("spool: %w", err)
		}
	}
	return nil
}

func truncateSync(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = datasync(f)
	}
	return errors.Join(err, f.Close())
}

// scanResult describes a data file: its valid prefix and, if the file does
// not end there cleanly, why.
type scanResult struct {
	size    int64 // file size
	end     int64 // end of the valid prefix: a record boundary, or 0 if the header is bad
	records int64 // records in the valid prefix
	ackEnd  int64 // the last record boundary at or below the ack offset
	ackRecs int64 // records below ackEnd
	fault   error // nil when the file ends at end
	torn    bool  // the fault looks like an append cut short
}

// scanFile reads a data file through and validates every record, calling
// visit (if not nil) with the bounds and body of each valid one. An I/O
// error is returned as err; what is wrong with the bytes goes in fault.
func scanFile(path string, ack int64, visit func(start, end int64, body []byte)) (scanResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return scanResult{}, fmt.Errorf("spool: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return scanResult{}, fmt.Errorf("spool: %w", err)
	}
	sc, err := scan(f, fi.Size(), ack, visit)
	if err != nil {
		err = fmt.Errorf("spool: read %s: %w", path, err)
	}
	return sc, err
}

// scan is scanFile on the size bytes of f.
func scan(f io.ReaderAt, size, ack int64, visit func(start, end int64, body []byte)) (sc scanResult, err error) {
	sc.size = size
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), int(min(size, 1<<20)))
	var hdr [recordHeaderSize]byte
	if sc.size < fileHeaderSize {
		sc.fault, sc.torn = fmt.Errorf("%w: file header truncated", ErrCorrupt), true
		return sc, nil
	}
	var fh [fileHeaderSize]byte
	if _, err := io.ReadFull(r, fh[:]); err != nil {
		return sc, err
	}
	if fh != fileHeader {
		sc.fault = fmt.Errorf("%w: bad file header %x", ErrCorrupt, fh)
		sc.torn, err = allZero(f, 0, sc.size)
		return sc, err
	}
	sc.end, sc.ackEnd = fileHeaderSize, fileHeaderSize
	var body []byte
	for sc.end < sc.size {
		if sc.size-sc.end < recordHeaderSize {
			sc.fault, sc.torn = errShort, true
			return sc, nil
		}
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return sc, err
		}
		n, lerr := bodyLen(hdr[:])
		if lerr != nil {
			// A zero-filled tail is what some file systems leave of an
			// append whose data never reached the disk. Anything else is a
			// damaged header, whose length cannot be trusted.
			sc.fault = lerr
			sc.torn, err = allZero(f, sc.end, sc.size)
			return sc, err
		}
		next := sc.end + recordHeaderSize + int64(n)
		if next > sc.size {
			// The header's CRC vouches for the length: the append was cut.
			sc.fault, sc.torn = errShort, true
			return sc, nil
		}
		body = slices.Grow(body[:0], n)[:n]
		if _, err := io.ReadFull(r, body); err != nil {
			return sc, err
		}
		if err := verify(hdr[:], body); err != nil {
			// A bad last record is a torn append (its pages were only
			// partly written); a bad record with more after it is not.
			sc.fault, sc.torn = err, next == sc.size
			return sc, nil
		}
		if err := parseBody(body, nil); err != nil {
			sc.fault = err
			return sc, nil
		}
		if visit != nil {
			visit(sc.end, next, body)
		}
		sc.end = next
		sc.records++
		if sc.end <= ack {
			sc.ackEnd, sc.ackRecs = sc.end, sc.records
		}
	}
	return sc, nil
}

// allZero reports whether f holds only zero bytes in [from, to).
func allZero(f io.ReaderAt, from, to int64) (bool, error) {
	buf := make([]byte, min(to-from, 64<<10))
	for from < to {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), to-from)], from)
		for _, b := range buf[:n] {
			if b != 0 {
				return false, nil
			}
		}
		from += int64(n)
		if err != nil && from < to {
			return false, err
		}
	}
	return true, nil
}

// The ack file of a data file records which of its records are done. It is
// a sequence of 12-byte entries, a u64 little-endian value then the
// CRC-32C of those 8 bytes, written and synced by Replay. A value with the
// top bit clear is a prefix: every record below that offset is done. A
// value with the top bit set marks the one record starting at the offset in
// the other bits as done (stored, or quarantined on its own). Every entry
// states a fact, so entries are only ever added; reading stops at the first
// entry that does not check out (a torn write), which only means replay
// repeats more.
const (
	ackEntrySize = 12
	ackMark      = uint64(1) << 63
)

func appendAckEntry(dst []byte, off int64) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(off))
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[len(dst)-8:], crcTable))
}

func appendAckMark(dst []byte, off int64) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(off)|ackMark)
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[len(dst)-8:], crcTable))
}

// ackState is what an ack file says.
type ackState struct {
	prefix int64              // the highest prefix entry
	marks  map[int64]struct{} // starts of records marked done
	size   int64              // bytes of valid entries: new entries go there
}

// readAck reads the ack file at path; a missing file says nothing is done.
func readAck(path string) (ackState, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ackState{}, nil
	}
	if err != nil {
		return ackState{}, fmt.Errorf("spool: %w", err)
	}
	return parseAckState(b), nil
}

func parseAckState(b []byte) ackState {
	st := ackState{marks: map[int64]struct{}{}}
	for ; len(b) >= ackEntrySize; b = b[ackEntrySize:] {
		if crc32.Checksum(b[:8], crcTable) != binary.LittleEndian.Uint32(b[8:]) {
			break
		}
		v := binary.LittleEndian.Uint64(b)
		if v&ackMark != 0 {
			st.marks[int64(v&^ackMark)] = struct{}{}
		} else {
			st.prefix = max(st.prefix, int64(v))
		}
		st.size += ackEntrySize
	}
	return st
}

// parseAck returns the prefix an ack file's bytes record, or 0.
func parseAck(b []byte) int64 { return parseAckState(b).prefix }
