package spool

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// crashDir copies the files of dir (what a crash would leave on disk, since
// everything acknowledged is synced) into a fresh directory, letting edit
// change each data file's bytes on the way.
func crashDir(t testing.TB, dir string, edit func(name string, b []byte) []byte) string {
	t.Helper()
	out := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == lockName {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil && filepath.Ext(e.Name()) == extData {
			b = edit(e.Name(), b)
		}
		if err := os.WriteFile(filepath.Join(out, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// replayAll opens dir, replays everything and returns what came out.
func replayAll(t testing.TB, dir string) ([]Record, Stats) {
	t.Helper()
	s := openT(t, dir)
	var c collector
	if _, err := s.Replay(context.Background(), c.fn); err != nil {
		t.Fatalf("replay: %v", err)
	}
	st := s.Stats()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return c.records(), st
}

func checkPrefix(t testing.TB, want, got []Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("replayed %d records, want the intact prefix of %d", len(got), len(want))
	}
	for i := range want {
		if !sameRecord(got[i], want[i]) {
			t.Fatalf("record %d: got %+v want %+v", i, got[i], want[i])
		}
	}
}

// spoolOf writes recs (one Append each) into a fresh spool and returns its
// directory, closed, with the data file's name and bytes.
func spoolOf(t testing.TB, recs []Record) (dir, name string, data []byte) {
	t.Helper()
	dir = t.TempDir()
	s := openT(t, dir)
	appendAll(t, s, recs)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files := dataFiles(t, dir, extData)
	if len(files) != 1 {
		t.Fatalf("files %v", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return dir, filepath.Base(files[0]), data
}

// TestTornTailEveryOffset cuts the file at every byte of its last record:
// Open and Replay must yield exactly the records before it, and the spool
// must keep working on the same directory.
func TestTornTailEveryOffset(t *testing.T) {
	var recs []Record
	for i := range 5 {
		recs = append(recs, rec(i%2, i))
	}
	last := recs[4]
	last.TraceID = [16]byte{9}
	recs[4] = last
	dir, _, data := spoolOf(t, recs)
	lastStart := len(data) - recordHeaderSize - bodySize(&recs[4])
	for cut := lastStart; cut <= len(data); cut++ {
		d := crashDir(t, dir, func(_ string, b []byte) []byte { return b[:cut] })
		got, st := replayAll(t, d)
		if cut == len(data) {
			checkExactlyOnce(t, recs, got)
			continue
		}
		checkExactlyOnce(t, recs[:4], got)
		wantTorn := 0
		if cut > lastStart {
			wantTorn = 1
		}
		if st.TornTails != wantTorn || st.QuarantinedFiles != 0 {
			t.Fatalf("cut %d: %+v", cut, st)
		}
		if cut == lastStart+1 || cut == len(data)-1 {
			// The directory is usable afterwards: new appends replay.
			s := openT(t, d)
			if s.Stats().PendingRecords != 0 {
				t.Fatal("replayed records came back")
			}
			more := []Record{rec(3, 0), rec(3, 1)}
			appendAll(t, s, more)
			s.Close()
			got, _ := replayAll(t, d)
			checkPrefix(t, more, got)
		}
	}
}

// TestFlipLastRecord flips each byte of the last record in turn: never
// garbage, exactly the intact prefix, and the damage is reported either as
// a torn tail or as a quarantined file.
func TestFlipLastRecord(t *testing.T) {
	var recs []Record
	for i := range 4 {
		recs = append(recs, rec(0, i))
	}
	dir, _, data := spoolOf(t, recs)
	lastStart := len(data) - recordHeaderSize - bodySize(&recs[3])
	for pos := lastStart; pos < len(data); pos++ {
		mask := []byte{0x01, 0xff, 0x80}[pos%3] // one bit, a whole byte, the top bit
		d := crashDir(t, dir, func(_ string, b []byte) []byte {
			b[pos] ^= mask
			return b
		})
		got, st := replayAll(t, d)
		checkPrefix(t, recs[:3], got)
		if st.TornTails+st.QuarantinedFiles != 1 {
			t.Fatalf("flip %#x at %d: %+v", mask, pos, st)
		}
	}
}

// TestCorruptMiddle: a damaged record with intact records after it stops
// the file there. The prefix is replayed, the file quarantined (the records
// after the damage are never resynchronised on), and later files flow.
func TestCorruptMiddle(t *testing.T) {
	var recs []Record
	for i := range 10 {
		recs = append(recs, rec(0, i))
	}
	dir, _, data := spoolOf(t, recs)
	size := recordHeaderSize + bodySize(&recs[0])
	third := fileHeaderSize + 3*size
	for _, pos := range []int{third, third + 2, third + 5, third + 40, third + size - 1} {
		d := crashDir(t, dir, func(_ string, b []byte) []byte {
			b[pos] ^= 0x10
			return b
		})
		s := openT(t, d)
		if st := s.Stats(); !errors.Is(st.LastError, ErrCorrupt) || st.PendingRecords != 3 {
			t.Fatalf("pos %d: open stats %+v", pos, st)
		}
		later := []Record{rec(1, 0), rec(1, 1)}
		appendAll(t, s, later)
		var c collector
		if n, err := s.Replay(context.Background(), c.fn); err != nil || n != 5 {
			t.Fatalf("pos %d: n=%d err=%v", pos, n, err)
		}
		checkPrefix(t, append(recs[:3:3], later...), c.records())
		st := s.Stats()
		if st.QuarantinedFiles != 1 || st.TornTails != 0 || st.Files != 0 || !errors.Is(st.LastError, ErrCorrupt) {
			t.Fatalf("pos %d: %+v", pos, st)
		}
		q := dataFiles(t, d, extData+extQuar)
		if len(q) != 1 {
			t.Fatalf("quarantine %v", q)
		}
		if b, _ := os.ReadFile(q[0]); !bytes.Equal(b[third+size:], data[third+size:]) {
			t.Fatal("the quarantined file lost its bytes")
		}
		s.Close()
	}
}

// TestOlderFileTailIsCorruption: only the newest file can be torn; a bad
// last record in an older (sealed) file is corruption and quarantined.
func TestOlderFileTailIsCorruption(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, func(o *Options) { o.MaxFileSize = 1000 })
	var recs []Record
	for i := range 6 {
		recs = append(recs, rec(0, i))
	}
	appendAll(t, s, recs) // three records per file
	s.Close()
	files := dataFiles(t, dir, extData)
	if len(files) != 2 {
		t.Fatalf("files %v", files)
	}
	first := filepath.Base(files[0])
	d := crashDir(t, dir, func(name string, b []byte) []byte {
		if name == first {
			b[len(b)-1] ^= 1
		}
		return b
	})
	got, st := replayAll(t, d)
	checkPrefix(t, append(recs[:2:2], recs[3:]...), got)
	if st.QuarantinedFiles != 1 || st.TornTails != 0 {
		t.Fatalf("%+v", st)
	}
}

// TestZeroTail: some file systems leave a zero-filled tail after a crash
// during an append; it is a torn tail, not corruption.
func TestZeroTail(t *testing.T) {
	recs := []Record{rec(0, 0), rec(0, 1)}
	dir, _, _ := spoolOf(t, recs)
	d := crashDir(t, dir, func(_ string, b []byte) []byte { return append(b, make([]byte, 4096)...) })
	got, st := replayAll(t, d)
	checkPrefix(t, recs, got)
	if st.TornTails != 1 || st.QuarantinedFiles != 0 {
		t.Fatalf("%+v", st)
	}
}

// TestCutCreation: a crash while creating a file leaves it shorter than
// its header, or zero-filled; Open removes it.
func TestCutCreation(t *testing.T) {
	recs := []Record{rec(0, 0)}
	dir, _, _ := spoolOf(t, recs)
	for _, tail := range [][]byte{nil, fileHeader[:3], make([]byte, fileHeaderSize), fileHeader[:]} {
		d := crashDir(t, dir, nil)
		if err := os.WriteFile(filepath.Join(d, "00000000000000ff"+extData), tail, 0o600); err != nil {
			t.Fatal(err)
		}
		got, st := replayAll(t, d)
		checkPrefix(t, recs, got)
		if st.QuarantinedFiles != 0 {
			t.Fatalf("tail %x: %+v", tail, st)
		}
		if f := dataFiles(t, d, extData); len(f) != 0 {
			t.Fatalf("tail %x: left %v", tail, f)
		}
	}
}

// TestCrashMidReplay: a replay that confirmed part of the records and then
// "crashed" resumes after the confirmed prefix: confirmed records are never
// offered again, and the repeats are limited to the failing chunk.
func TestCrashMidReplay(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, func(o *Options) { o.ReplayBatchRecords = 100; o.MaxFileSize = 200 << 10 })
	var recs []Record
	for i := range 3000 {
		recs = append(recs, rec(i%3, i))
	}
	if err := s.Append(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("database went away")
	failAt := "k1-001234"
	c1 := collector{fail: func(b []Record) (int, error) {
		for i, r := range b {
			if r.TransactionID == failAt {
				return i, boom
			}
		}
		return len(b), nil
	}}
	// Partition p1 stops at record 1234 for the rest of the pass; p0 and
	// p2 go on to the end.
	var stored, rest []Record
	for i, r := range recs {
		if r.Partition == "p1" && i >= 1234 {
			rest = append(rest, r)
		} else {
			stored = append(stored, r)
		}
	}
	n, err := s.Replay(context.Background(), c1.fn)
	if !errors.Is(err, boom) || n != len(stored) {
		t.Fatalf("first pass: n=%d err=%v, want %d and the failure", n, err, len(stored))
	}
	checkExactlyOnce(t, stored, c1.records())
	if st := s.Stats(); st.PendingRecords != int64(len(rest)) || st.Replayed != int64(n) {
		t.Fatalf("stats %+v", st)
	}
	// Crash now: copy what is on disk and start over from it. Only p1's
	// records from 1234 on come again.
	d := crashDir(t, dir, nil)
	s2 := openT(t, d)
	if st := s2.Stats(); st.PendingRecords != int64(len(rest)) {
		t.Fatalf("after crash: %+v", st)
	}
	if !s2.Pending(testTenant, "orders", "p1") || s2.Pending(testTenant, "orders", "p0") {
		t.Fatal("after crash: Pending is wrong")
	}
	var c2 collector
	if m, err := s2.Replay(context.Background(), c2.fn); err != nil || m != len(rest) {
		t.Fatalf("second pass: n=%d err=%v", m, err)
	}
	checkExactlyOnce(t, rest, c2.records())
	// The same on the original directory, without a crash.
	var c3 collector
	if m, err := s.Replay(context.Background(), c3.fn); err != nil || m != len(rest) {
		t.Fatalf("resume in process: n=%d err=%v", m, err)
	}
	checkExactlyOnce(t, rest, c3.records())
}
