package settings

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
)

// Peek never waits on a read: a missing queue is reported unknown without
// one, a fresh entry serves without one, a stale entry serves while one
// runs; Refresh reads again while the old entry serves, so a queue's id
// learned after its creation reaches the cache.
func TestPeekAndRefresh(t *testing.T) {
	var reads atomic.Int64
	var id atomic.Int64
	release := make(chan struct{})
	read := func(ctx context.Context, _ uuid.UUID, _ string) (Meta, error) {
		reads.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return Meta{}, ctx.Err()
		}
		return Meta{Lanes: 4, ID: id.Load()}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := New(ctx, 5*time.Second, read, 0)
	tenant := uuid.Must(uuid.NewV4())

	if _, ok := c.Peek(tenant, "q"); ok {
		t.Fatal("Peek of a queue never read: ok")
	}
	if n := reads.Load(); n != 0 {
		t.Fatalf("Peek of a missing queue started %d reads, want 0", n)
	}

	close(release) // reads answer at once from here on
	m, err := c.Get(ctx, tenant, "q")
	if err != nil || m.ID != 0 || m.Lanes != 4 {
		t.Fatalf("Get = %+v, %v", m, err)
	}
	if m, ok := c.Peek(tenant, "q"); !ok || m.Lanes != 4 || reads.Load() != 1 {
		t.Fatalf("Peek of a fresh entry = %+v, %v after %d reads; want the entry, no read", m, ok, reads.Load())
	}

	id.Store(42) // the queue was created
	c.Refresh(tenant, "q")
	waitID(t, c, tenant, 42)

	id.Store(43) // recreated; the entry goes stale
	c.Expire()
	if m, ok := c.Peek(tenant, "q"); !ok || m.ID != 42 {
		t.Fatalf("Peek of a stale entry = %+v, %v; want it served", m, ok)
	}
	waitID(t, c, tenant, 43)
}

func waitID(t *testing.T, c *Cache, tenant uuid.UUID, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.RLock()
		ent := c.m[key{tenant, "q"}]
		c.mu.RUnlock()
		if ent != nil && ent.meta.ID == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cache did not learn id %d", want)
		}
		time.Sleep(time.Millisecond)
	}
}
