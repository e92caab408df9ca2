package perkey

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type msg struct {
	key string
	off int64
}

func batchOf(keys ...string) []msg {
	out := make([]msg, len(keys))
	for i, k := range keys {
		out[i] = msg{k, int64(i)}
	}
	return out
}

type recorder struct {
	mu        sync.Mutex
	order     map[string][]int64
	running   map[string]bool
	overlap   bool
	active    atomic.Int32
	maxActive atomic.Int32
}

func newRecorder() *recorder {
	return &recorder{order: map[string][]int64{}, running: map[string]bool{}}
}

func (r *recorder) enter(m msg) {
	r.mu.Lock()
	if r.running[m.key] {
		r.overlap = true
	}
	r.running[m.key] = true
	r.order[m.key] = append(r.order[m.key], m.off)
	r.mu.Unlock()
	a := r.active.Add(1)
	for {
		x := r.maxActive.Load()
		if a <= x || r.maxActive.CompareAndSwap(x, a) {
			break
		}
	}
}

func (r *recorder) leave(m msg) {
	r.active.Add(-1)
	r.mu.Lock()
	r.running[m.key] = false
	r.mu.Unlock()
}

func config(limit int, stop func() bool, handle func(msg) Outcome) Config[msg] {
	return Config[msg]{
		Limit:  limit,
		Key:    func(m msg) string { return m.key },
		Offset: func(m msg) int64 { return m.off },
		Stop:   stop,
		Handle: handle,
	}
}

// Every message is handled once, each key in offset order and one at a
// time, at most Limit at once.
func TestRunEachKeyInOrder(t *testing.T) {
	var keys []string
	for range 500 {
		keys = append(keys, fmt.Sprint("k", rand.IntN(12)))
	}
	msgs := batchOf(keys...)
	r := newRecorder()
	b := New(config(4, func() bool { return false }, func(m msg) Outcome {
		r.enter(m)
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		r.leave(m)
		return Next
	}), msgs)
	b.Run()
	if r.overlap {
		t.Fatal("two messages of one key ran at once")
	}
	if m := r.maxActive.Load(); m > 4 {
		t.Fatalf("%d handlers ran at once, want at most 4", m)
	}
	n := 0
	for k, offs := range r.order {
		if !slices.IsSorted(offs) {
			t.Fatalf("key %s handled out of order: %v", k, offs)
		}
		n += len(offs)
	}
	if n != len(msgs) {
		t.Fatalf("handled %d messages, want %d", n, len(msgs))
	}
	if !b.Started() || slices.Collect(b.Unstarted()) != nil {
		t.Fatalf("started %v, unstarted %v: want all handled", b.Started(), slices.Collect(b.Unstarted()))
	}
}

// With one handler at a time, the key whose next message has the lowest
// offset goes first.
func TestRunLowestOffsetFirst(t *testing.T) {
	msgs := batchOf("a", "b", "a", "c", "b", "a")
	var got []int64
	New(config(1, func() bool { return false }, func(m msg) Outcome {
		got = append(got, m.off)
		return Next
	}), msgs).Run()
	if want := []int64{0, 1, 2, 3, 4, 5}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// A paused key's rest is neither started nor handed back; a held key's
// rest is handed back; other keys go on.
func TestPauseAndHold(t *testing.T) {
	msgs := batchOf("p", "h", "x", "p", "h", "x", "p")
	var mu sync.Mutex
	var got []int64
	b := New(config(2, func() bool { return false }, func(m msg) Outcome {
		mu.Lock()
		got = append(got, m.off)
		mu.Unlock()
		switch m.key {
		case "p":
			return Pause
		case "h":
			return Hold
		}
		return Next
	}), msgs)
	b.Run()
	slices.Sort(got)
	if want := []int64{0, 1, 2, 5}; !slices.Equal(got, want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
	var back []int64
	for m := range b.Unstarted() {
		back = append(back, m.off)
	}
	if want := []int64{4}; !slices.Equal(back, want) {
		t.Fatalf("handed back %v, want %v (the held key's rest, not the paused key's)", back, want)
	}
}

// Once Stop says so nothing more starts; Run waits for the started ones
// and Unstarted names the rest.
func TestStop(t *testing.T) {
	msgs := batchOf("a", "b", "a", "b", "a")
	var stopped atomic.Bool
	var handled atomic.Int32
	b := New(config(2, stopped.Load, func(m msg) Outcome {
		handled.Add(1)
		stopped.Store(true)
		time.Sleep(5 * time.Millisecond)
		return Next
	}), msgs)
	b.Run()
	h := int(handled.Load())
	if h < 1 || h > 2 {
		t.Fatalf("handled %d after the first stop, want the 1 or 2 already started", h)
	}
	if n := len(slices.Collect(b.Unstarted())); n != len(msgs)-h {
		t.Fatalf("%d unstarted, want %d", n, len(msgs)-h)
	}
	empty := New(config(2, func() bool { return true }, func(msg) Outcome { t.Error("started while stopped"); return Next }), msgs)
	empty.Run()
	if empty.Started() {
		t.Fatal("Started after a run that started nothing")
	}
}
