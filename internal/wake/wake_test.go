package wake

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sent records the payloads a hub notifies, in place of the database.
type sent struct {
	mu       sync.Mutex
	payloads []string
	got      chan struct{}
}

func (s *sent) Exec(_ context.Context, _ string, args ...any) (pgconn.CommandTag, error) {
	s.mu.Lock()
	s.payloads = append(s.payloads, args[1].(string))
	s.mu.Unlock()
	s.got <- struct{}{}
	return pgconn.CommandTag{}, nil
}

func newHub(t *testing.T) (*Hub, *sent) {
	t.Helper()
	s := &sent{got: make(chan struct{}, 16)}
	h := New(context.Background(), Config{Pool: s, Channel: "c", Timeout: time.Second, Log: slog.New(slog.DiscardHandler)})
	t.Cleanup(h.Close)
	return h, s
}

// drained empties w's channel and reports whether a wake was in it.
func drained(w *Waiter) bool {
	select {
	case <-w.C():
		return true
	default:
		return false
	}
}

// A hub's own notification, coming back through LISTEN, wakes none of its
// waiters again (the commit woke them; a second wake costs an empty claim),
// while another hub's, and a payload that names no sender (PushTx's, an
// older release's), does.
func TestOwnNotificationNotRedelivered(t *testing.T) {
	a, sa := newHub(t)
	b, _ := newHub(t)
	tenant := uuid.Must(uuid.NewV4())
	wa, wb := a.Subscribe(tenant, "q"), b.Subscribe(tenant, "q")

	a.Pushed(tenant, "q", "p")
	if !drained(wa) {
		t.Fatal("the push woke no local waiter")
	}
	<-sa.got
	sa.mu.Lock()
	payload := sa.payloads[0]
	sa.mu.Unlock()

	a.Remote(payload)
	if drained(wa) {
		t.Errorf("the hub's own notification %q woke its waiter again", payload)
	}
	b.Remote(payload)
	if !drained(wb) {
		t.Errorf("another hub's notification %q woke no waiter", payload)
	}
	a.Remote(QueueKey{tenant, "q"}.Line())
	if !drained(wa) {
		t.Error("a notification without a sender woke no waiter")
	}
}

// PushedAll is Pushed for each of a bundle's partitions: each queue's
// waiters get their partitions as hints, and one notification names every
// queue.
func TestPushedAll(t *testing.T) {
	h, s := newHub(t)
	tenant := uuid.Must(uuid.NewV4())
	wq, wr := h.Subscribe(tenant, "q"), h.Subscribe(tenant, "r")
	h.PushedAll(func(yield func(QueueKey, string) bool) {
		for _, p := range []struct{ q, part string }{{"q", "a"}, {"q", "b"}, {"r", "c"}, {"q", "a"}} {
			if !yield(QueueKey{tenant, p.q}, p.part) {
				return
			}
		}
	})
	if !drained(wq) || !drained(wr) {
		t.Fatal("a queue's waiter was not woken")
	}
	hints := wq.TakeHints()
	slices.Sort(hints)
	if !slices.Equal(hints, []string{"a", "b"}) || !slices.Equal(wr.TakeHints(), []string{"c"}) {
		t.Fatalf("hints %v and %v", hints, wr.TakeHints())
	}
	<-s.got
	s.mu.Lock()
	payload := s.payloads[0]
	s.mu.Unlock()
	for _, q := range []string{"q", "r"} {
		if !strings.Contains(payload, QueueKey{tenant, q}.Line()) {
			t.Errorf("notification %q does not name queue %s", payload, q)
		}
	}
	h.PushedAll(func(func(QueueKey, string) bool) {}) // nothing pushed: no wake, no notification
	if drained(wq) || drained(wr) {
		t.Error("an empty bundle woke a waiter")
	}
}
