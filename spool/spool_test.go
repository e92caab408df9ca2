package spool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
)

var testTenant = uuid.Must(uuid.FromString("0195b6f4-0000-7000-8000-000000000001"))

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openT opens a spool on dir, closed when the test ends.
func openT(t testing.TB, dir string, mod ...func(*Options)) *Spool {
	t.Helper()
	o := Options{Dir: dir, Logger: quietLogger()}
	for _, m := range mod {
		m(&o)
	}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rec is the i-th record of key k: about 270 bytes encoded.
func rec(k, i int) Record {
	return Record{
		Tenant:        testTenant,
		Queue:         "orders",
		Partition:     fmt.Sprintf("p%d", k),
		TransactionID: fmt.Sprintf("k%d-%06d", k, i),
		MessageID:     uuid.Must(uuid.NewV7()),
		Payload:       bytes.Repeat([]byte{byte('a' + k%26)}, 200),
	}
}

func appendAll(t testing.TB, s *Spool, recs []Record) {
	t.Helper()
	for i := range recs {
		if err := s.Append(context.Background(), recs[i:i+1]); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
}

// collector is a ReplayFunc that stores everything.
type collector struct {
	mu      sync.Mutex
	got     []Record
	batches int
	// fail, if set, decides per batch: how many to store and the error.
	fail func(batch []Record) (int, error)
}

func (c *collector) fn(ctx context.Context, batch []Record) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches++
	for _, r := range batch[1:] {
		if r.Tenant != batch[0].Tenant || r.Queue != batch[0].Queue || r.Partition != batch[0].Partition {
			panic("batch mixes keys")
		}
	}
	n, err := len(batch), error(nil)
	if c.fail != nil {
		n, err = c.fail(batch)
	}
	c.got = append(c.got, batch[:max(0, min(n, len(batch)))]...)
	return n, err
}

func (c *collector) records() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// byKey splits records by partition, keeping order.
func byKey(recs []Record) map[string][]string {
	m := map[string][]string{}
	for _, r := range recs {
		m[r.Partition] = append(m[r.Partition], r.TransactionID)
	}
	return m
}

// checkExactlyOnce fails unless got holds every record of want exactly once,
// unaltered, in want's order within each partition.
func checkExactlyOnce(t testing.TB, want, got []Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("replayed %d records, want %d", len(got), len(want))
	}
	orig := map[string]Record{}
	for _, r := range want {
		orig[r.TransactionID] = r
	}
	for _, r := range got {
		w, ok := orig[r.TransactionID]
		if !ok {
			t.Fatalf("replayed unknown or repeated record %q", r.TransactionID)
		}
		if !sameRecord(r, w) {
			t.Fatalf("record %q altered: got %+v", r.TransactionID, r)
		}
		delete(orig, r.TransactionID)
	}
	wk, gk := byKey(want), byKey(got)
	for k := range wk {
		if !slices.Equal(wk[k], gk[k]) {
			t.Fatalf("partition %s out of order", k)
		}
	}
}

func dataFiles(t testing.TB, dir string, ext string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+ext))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(m)
	return m
}

func TestReplayAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	var want []Record
	for i := range 300 {
		want = append(want, rec(i%7, i))
	}
	s := openT(t, dir)
	appendAll(t, s, want[:100])
	if err := s.Append(context.Background(), want[100:]); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.PendingRecords != 300 || st.Appended != 300 {
		t.Fatalf("stats %+v", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openT(t, dir)
	if st := s.Stats(); st.PendingRecords != 300 || st.Files != 1 {
		t.Fatalf("after reopen: %+v", st)
	}
	var c collector
	n, err := s.Replay(context.Background(), c.fn)
	if err != nil || n != 300 {
		t.Fatalf("replay: n=%d err=%v", n, err)
	}
	checkExactlyOnce(t, want, c.records())
	if c.batches < 7 {
		t.Fatalf("%d batches for 7 keys", c.batches)
	}
	if st := s.Stats(); st.PendingRecords != 0 || st.Replayed != 300 || st.Files != 0 {
		t.Fatalf("after replay: %+v", st)
	}
	if n, err := s.Replay(context.Background(), c.fn); n != 0 || err != nil {
		t.Fatalf("second replay: n=%d err=%v", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if f := dataFiles(t, dir, extData); len(f) != 0 {
		t.Fatalf("files left: %v", f)
	}
	s = openT(t, dir)
	if n, err := s.Replay(context.Background(), c.fn); n != 0 || err != nil {
		t.Fatalf("replay after third open: n=%d err=%v", n, err)
	}
}

func TestGroupingPreservesOrder(t *testing.T) {
	var want []Record
	for i := range 1000 {
		r := rec(i%5, i)
		if i%3 == 0 {
			r.Tenant = uuid.Nil // same partition names, other tenant: another key
		}
		want = append(want, r)
	}
	for _, conc := range []int{1, 8} {
		t.Run(fmt.Sprint("concurrency=", conc), func(t *testing.T) {
			s := openT(t, t.TempDir(), func(o *Options) { o.ReplayConcurrency = conc; o.ReplayBatchRecords = 64 })
			if err := s.Append(context.Background(), want); err != nil {
				t.Fatal(err)
			}
			var c collector
			if n, err := s.Replay(context.Background(), c.fn); err != nil || n != len(want) {
				t.Fatalf("n=%d err=%v", n, err)
			}
			got := c.records()
			if len(got) != len(want) {
				t.Fatalf("got %d", len(got))
			}
			// Order per (tenant, partition).
			split := func(rs []Record) map[string][]string {
				m := map[string][]string{}
				for _, r := range rs {
					k := r.Tenant.String() + r.Partition
					m[k] = append(m[k], r.TransactionID)
				}
				return m
			}
			w, g := split(want), split(got)
			if len(w) != 10 {
				t.Fatalf("%d keys", len(w))
			}
			for k := range w {
				if !slices.Equal(w[k], g[k]) {
					t.Fatalf("key %s out of order", k)
				}
			}
		})
	}
}

func TestRotation(t *testing.T) {
	dir := t.TempDir()
	const max = 4096
	s := openT(t, dir, func(o *Options) { o.MaxFileSize = max })
	var want []Record
	for i := range 100 {
		want = append(want, rec(0, i))
	}
	appendAll(t, s, want)
	files := dataFiles(t, dir, extData)
	if len(files) < 100*270/max {
		t.Fatalf("%d files", len(files))
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > max {
			t.Fatalf("%s has %d bytes > MaxFileSize", f, fi.Size())
		}
	}
	// One Append larger than MaxFileSize gets a file of its own.
	big := make([]Record, 20)
	for i := range big {
		big[i] = rec(1, i)
	}
	if err := s.Append(context.Background(), big); err != nil {
		t.Fatal(err)
	}
	want = append(want, big...)
	if st := s.Stats(); st.Files != len(files)+1 {
		t.Fatalf("files %d, want %d", st.Files, len(files)+1)
	}
	var c collector
	if n, err := s.Replay(context.Background(), c.fn); err != nil || n != len(want) {
		t.Fatalf("n=%d err=%v", n, err)
	}
	checkExactlyOnce(t, want, c.records())
	if got := c.records(); got[0].TransactionID != want[0].TransactionID || got[99].TransactionID != want[99].TransactionID {
		t.Fatal("files replayed out of order")
	}
	if f := dataFiles(t, dir, extData); len(f) != 0 {
		t.Fatalf("replayed files left: %v", f)
	}
}

func TestFull(t *testing.T) {
	for _, mode := range []SyncMode{GroupCommit, SyncEach} {
		t.Run(mode.String(), func(t *testing.T) {
			s := openT(t, t.TempDir(), func(o *Options) { o.MaxTotalSize = 10 << 10; o.MaxFileSize = 4 << 10; o.Sync = mode })
			var acked []Record
			full := 0
			for i := range 100 {
				r := rec(0, i)
				err := s.Append(context.Background(), []Record{r})
				switch {
				case err == nil:
					acked = append(acked, r)
				case errors.Is(err, ErrFull):
					full++
				default:
					t.Fatal(err)
				}
			}
			if full == 0 || len(acked) < 30 {
				t.Fatalf("%d acked, %d full", len(acked), full)
			}
			if st := s.Stats(); st.TotalBytes > 10<<10 {
				t.Fatalf("total %d over the limit", st.TotalBytes)
			}
			var c collector
			if _, err := s.Replay(context.Background(), c.fn); err != nil {
				t.Fatal(err)
			}
			checkExactlyOnce(t, acked, c.records())
			// Replay freed the space.
			if err := s.Append(context.Background(), []Record{rec(0, 1000)}); err != nil {
				t.Fatalf("append after replay: %v", err)
			}
		})
	}
}

func TestAppendErrors(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	huge := rec(0, 0)
	huge.Payload = make([]byte, MaxRecordSize)
	if err := s.Append(context.Background(), []Record{rec(0, 1), huge}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("huge: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Append(ctx, []Record{rec(0, 2)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if st := s.Stats(); st.Appended != 0 || st.TotalBytes != 0 {
		t.Fatalf("rejected appends left traces: %+v", st)
	}
	if _, err := Open(Options{Dir: dir}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(context.Background(), []Record{rec(0, 3)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	if _, err := s.Replay(context.Background(), (&collector{}).fn); !errors.Is(err, ErrClosed) {
		t.Fatalf("replay after close: %v", err)
	}
	openT(t, dir) // the lock was released
}

// TestGroupCommitSharesSyncs: concurrent appenders share syncs under
// GroupCommit, and each Append gets its own under SyncEach.
func TestGroupCommitSharesSyncs(t *testing.T) {
	const goroutines, each = 64, 20
	for _, mode := range []SyncMode{GroupCommit, SyncEach} {
		t.Run(mode.String(), func(t *testing.T) {
			s := openT(t, t.TempDir(), func(o *Options) { o.Sync = mode })
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range each {
						if err := s.Append(context.Background(), []Record{rec(g, i)}); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			st := s.Stats()
			t.Logf("%s: %d appends, %d syncs", mode, st.Appended, st.Fsyncs)
			if st.Appended != goroutines*each {
				t.Fatalf("appended %d", st.Appended)
			}
			if mode == SyncEach && st.Fsyncs != st.Appended {
				t.Fatalf("SyncEach: %d syncs for %d appends", st.Fsyncs, st.Appended)
			}
			if mode == GroupCommit && st.Fsyncs >= st.Appended {
				t.Fatalf("GroupCommit shared no sync: %d syncs for %d appends", st.Fsyncs, st.Appended)
			}
		})
	}
}

// TestConcurrentAppendReplay appends from many goroutines (each its own
// partition, in order) while Replay runs in a loop over rotating files.
func TestConcurrentAppendReplay(t *testing.T) {
	for _, mode := range []SyncMode{GroupCommit, SyncEach} {
		t.Run(mode.String(), func(t *testing.T) {
			s := openT(t, t.TempDir(), func(o *Options) {
				o.Sync = mode
				o.MaxFileSize = 16 << 10
				o.ReplayBatchRecords = 50
			})
			const goroutines, each = 8, 300
			var c collector
			var want [goroutines][]Record
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := 0; i < each; {
						n := min(1+i%3, each-i)
						batch := make([]Record, n)
						for j := range batch {
							batch[j] = rec(g, i+j)
						}
						if err := s.Append(context.Background(), batch); err != nil {
							t.Error(err)
							return
						}
						want[g] = append(want[g], batch...)
						i += n
					}
				})
			}
			stop := make(chan struct{})
			replayDone := make(chan struct{})
			passes := 0
			go func() {
				defer close(replayDone)
				for {
					if _, err := s.Replay(context.Background(), c.fn); err != nil {
						t.Error(err)
						return
					}
					passes++
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
			}()
			wg.Wait()
			close(stop)
			<-replayDone
			if _, err := s.Replay(context.Background(), c.fn); err != nil {
				t.Fatal(err)
			}
			var all []Record
			for _, w := range want {
				all = append(all, w...)
			}
			checkExactlyOnce(t, all, c.records())
			st := s.Stats()
			if st.PendingRecords != 0 || st.Files != 0 || st.TotalBytes != 0 {
				t.Fatalf("after final replay: %+v", st)
			}
			t.Logf("%d concurrent passes", passes)
		})
	}
}

// TestCloseCancelsReplay: Close ends a Replay blocked in its ReplayFunc, and
// the unconfirmed records are still there for the next Open.
func TestCloseCancelsReplay(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{rec(0, 0), rec(0, 1)}
	if err := s.Append(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		_, err := s.Replay(context.Background(), func(ctx context.Context, b []Record) (int, error) {
			close(entered)
			<-ctx.Done()
			return 0, ctx.Err()
		})
		res <- err
	}()
	<-entered
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Replay returns as Close cancels it; its goroutine reports a moment
	// later.
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("replay returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Replay still running after Close")
	}
	s = openT(t, dir)
	var c collector
	if _, err := s.Replay(context.Background(), c.fn); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, want, c.records())
}

// TestPermanentQuarantine: a record that keeps failing permanently is
// quarantined on its own after QuarantineAfter passes; every other record,
// before or after it, in its file or the next, is delivered exactly once.
func TestPermanentQuarantine(t *testing.T) {
	for _, conc := range []int{1, 8} {
		t.Run(fmt.Sprint("concurrency=", conc), func(t *testing.T) { testPermanentQuarantine(t, conc) })
	}
}

func testPermanentQuarantine(t *testing.T, conc int) {
	dir := t.TempDir()
	s := openT(t, dir, func(o *Options) { o.MaxFileSize = 3000; o.ReplayConcurrency = conc })
	var first, second, good []Record
	var bad Record
	for i := range 10 {
		r := rec(0, i)
		if i == 5 {
			r.Queue = "bad"
			bad = r
		} else {
			good = append(good, r)
		}
		first = append(first, r)
	}
	if err := s.Append(context.Background(), first); err != nil { // one file
		t.Fatal(err)
	}
	for i := range 5 {
		second = append(second, rec(1, i))
	}
	good = append(good, second...)
	if err := s.Append(context.Background(), second); err != nil { // rotates
		t.Fatal(err)
	}
	if st := s.Stats(); st.Files != 2 {
		t.Fatalf("files %d", st.Files)
	}
	errBad := errors.New("queue bad does not exist")
	c := collector{fail: func(b []Record) (int, error) {
		if b[0].Queue == "bad" {
			return 0, Permanent(errBad)
		}
		return len(b), nil
	}}
	for pass := 1; pass <= 2; pass++ {
		n, err := s.Replay(context.Background(), c.fn)
		if !errors.Is(err, errBad) || !IsPermanent(err) {
			t.Fatalf("pass %d: %v", pass, err)
		}
		if want := map[int]int{1: len(good), 2: 0}[pass]; n != want {
			t.Fatalf("pass %d: confirmed %d, want %d", pass, n, want)
		}
		if st := s.Stats(); st.QuarantinedFiles != 0 || st.PendingRecords != 1 {
			t.Fatalf("after %d passes: %+v", pass, st)
		}
	}
	if !s.Pending(testTenant, "bad", "p0") || s.Pending(testTenant, "orders", "p0") {
		t.Fatal("Pending is wrong")
	}
	n, err := s.Replay(context.Background(), c.fn)
	if err != nil || n != 0 {
		t.Fatalf("third pass: n=%d err=%v", n, err)
	}
	st := s.Stats()
	if st.QuarantinedFiles != 1 || st.QuarantinedRecords != 1 || st.QuarantinedBytes == 0 || !errors.Is(st.LastError, errBad) ||
		st.PendingRecords != 0 || st.Files != 0 {
		t.Fatalf("stats %+v", st)
	}
	if s.Pending(testTenant, "bad", "p0") {
		t.Fatal("a quarantined record is still pending")
	}
	checkExactlyOnce(t, good, c.records())
	q := dataFiles(t, dir, extData+extQuar)
	if len(q) != 1 {
		t.Fatalf("quarantine files %v", q)
	}
	s.Close()
	s = openT(t, dir)
	if st := s.Stats(); st.QuarantinedFiles != 1 || st.Files != 0 {
		t.Fatalf("after reopen %+v", st)
	}
	s.Close()
	// The quarantine file holds the bad record alone; an operator re-drives
	// it by renaming it back.
	redrive := t.TempDir()
	if err := os.Rename(q[0], filepath.Join(redrive, strings.TrimSuffix(filepath.Base(q[0]), extQuar))); err != nil {
		t.Fatal(err)
	}
	got, _ := replayAll(t, redrive)
	checkExactlyOnce(t, []Record{bad}, got)
}

// TestPoisonKeyDrainsToQuarantine: once a key has failed permanently in
// QuarantineAfter passes, each of its records that fails is quarantined at
// once, so a key that can never be stored does not take a pass per record.
func TestPoisonKeyDrainsToQuarantine(t *testing.T) {
	s := openT(t, t.TempDir(), func(o *Options) { o.QuarantineAfter = 2; o.ReplayBatchRecords = 7 })
	var want []Record
	for i := range 40 {
		r := rec(i%2, i)
		if i%2 == 0 {
			r.Queue = "poison"
		} else {
			want = append(want, r)
		}
		appendAll(t, s, []Record{r})
	}
	errBad := errors.New("never")
	c := collector{fail: func(b []Record) (int, error) {
		if b[0].Queue == "poison" {
			return 0, Permanent(errBad)
		}
		return len(b), nil
	}}
	if _, err := s.Replay(context.Background(), c.fn); !errors.Is(err, errBad) {
		t.Fatalf("first pass: %v", err)
	}
	if _, err := s.Replay(context.Background(), c.fn); err != nil {
		t.Fatalf("second pass: %v", err)
	}
	if st := s.Stats(); st.QuarantinedRecords != 20 || st.PendingRecords != 0 || st.Files != 0 {
		t.Fatalf("%+v", st)
	}
	checkExactlyOnce(t, want, c.records())
}

// TestReplayConfirmsPerKey: while one key keeps failing, the other keys'
// records are delivered once, whatever the number of passes and even
// across a crash; the failing key's records come later, in order, once.
func TestReplayConfirmsPerKey(t *testing.T) {
	for _, conc := range []int{1, 8} {
		t.Run(fmt.Sprint("concurrency=", conc), func(t *testing.T) {
			dir := t.TempDir()
			s := openT(t, dir, func(o *Options) { o.ReplayBatchRecords = 10; o.ReplayConcurrency = conc })
			var all []Record
			for i := range 200 {
				r := rec(i%5, i)
				all = append(all, r)
			}
			appendAll(t, s, all)
			locked := errors.New("row locked")
			var calls sync.Map // transaction id -> times delivered
			fail := func(b []Record) (int, error) {
				if b[0].Partition == "p0" {
					return 0, locked
				}
				for _, r := range b {
					n, _ := calls.LoadOrStore(r.TransactionID, new(int))
					*n.(*int)++
				}
				return len(b), nil
			}
			c := collector{fail: fail}
			for range 4 {
				if _, err := s.Replay(context.Background(), c.fn); !errors.Is(err, locked) {
					t.Fatalf("pass: %v", err)
				}
			}
			if !s.Pending(testTenant, "orders", "p0") || s.Pending(testTenant, "orders", "p1") {
				t.Fatal("Pending is wrong")
			}
			// Crash, then the lock goes away.
			d := crashDir(t, dir, nil)
			s2 := openT(t, d)
			c2 := collector{}
			if _, err := s2.Replay(context.Background(), c2.fn); err != nil {
				t.Fatal(err)
			}
			var p0, others []Record
			for _, r := range all {
				if r.Partition == "p0" {
					p0 = append(p0, r)
				} else {
					others = append(others, r)
				}
			}
			checkExactlyOnce(t, others, c.records())
			checkExactlyOnce(t, p0, c2.records())
			calls.Range(func(k, v any) bool {
				if *v.(*int) != 1 {
					t.Errorf("%v delivered %d times", k, *v.(*int))
				}
				return true
			})
			if st := s2.Stats(); st.PendingRecords != 0 || st.Files != 0 {
				t.Fatalf("%+v", st)
			}
		})
	}
}

func TestTransientNeverQuarantines(t *testing.T) {
	s := openT(t, t.TempDir(), func(o *Options) { o.QuarantineAfter = 2 })
	if err := s.Append(context.Background(), []Record{rec(0, 0), rec(0, 1)}); err != nil {
		t.Fatal(err)
	}
	down := errors.New("connection refused")
	c := collector{fail: func(b []Record) (int, error) { return 0, down }}
	for range 10 {
		if n, err := s.Replay(context.Background(), c.fn); n != 0 || !errors.Is(err, down) || IsPermanent(err) {
			t.Fatalf("n=%d err=%v", n, err)
		}
	}
	if st := s.Stats(); st.QuarantinedFiles != 0 || st.PendingRecords != 2 {
		t.Fatalf("%+v", st)
	}
	// A partial result with no error is transient too.
	c.fail = func(b []Record) (int, error) { return 1, nil }
	if n, err := s.Replay(context.Background(), c.fn); n != 1 || !errors.Is(err, errIncomplete) {
		t.Fatalf("partial: n=%d err=%v", n, err)
	}
	c.fail = nil
	if n, err := s.Replay(context.Background(), c.fn); n != 1 || err != nil {
		t.Fatalf("recovery: n=%d err=%v", n, err)
	}
}

func TestOptionsDefaults(t *testing.T) {
	o := Options{Dir: "x"}.withDefaults()
	if o.Sync != GroupCommit || o.MaxFileSize != 64<<20 || o.MaxTotalSize != 4<<30 || o.QuarantineAfter != 3 {
		t.Fatalf("%+v", o)
	}
	if _, err := Open(Options{}); err == nil || !strings.Contains(err.Error(), "Dir") {
		t.Fatalf("empty Dir: %v", err)
	}
}

// TestWriteError: an Append whose write fails reports the error, its
// records are not replayed, its reservation is released, and the next
// Append goes to a fresh file.
func TestWriteError(t *testing.T) {
	for _, mode := range []SyncMode{GroupCommit, SyncEach} {
		t.Run(mode.String(), func(t *testing.T) {
			s := openT(t, t.TempDir(), func(o *Options) { o.Sync = mode })
			ok1, lost, ok2 := rec(0, 1), rec(0, 2), rec(0, 3)
			appendAll(t, s, []Record{ok1})
			before := s.Stats()
			s.wmu.Lock()
			s.active.w.Close() // every write and the truncate now fail
			s.wmu.Unlock()
			if err := s.Append(context.Background(), []Record{lost}); err == nil {
				t.Fatal("append on a broken file succeeded")
			}
			st := s.Stats()
			if st.LastError == nil || st.TotalBytes != before.TotalBytes || st.Appended != 1 {
				t.Fatalf("after failure: %+v", st)
			}
			appendAll(t, s, []Record{ok2})
			if st := s.Stats(); st.Files != 2 {
				t.Fatalf("files %d, want a new one", st.Files)
			}
			var c collector
			if _, err := s.Replay(context.Background(), c.fn); err != nil {
				t.Fatal(err)
			}
			checkPrefix(t, []Record{ok1, ok2}, c.records())
		})
	}
}
