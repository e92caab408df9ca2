package queen

import (
	"context"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

// listener receives the NOTIFYs that wake hubs of every process send on
// the schema's channel and wakes this process's parked pops. It holds one
// dedicated connection outside the pool, so a busy pool never delays wakes
// and a caller-supplied pool loses no capacity.
type listener struct {
	e      *engine
	cancel context.CancelFunc
	done   chan struct{}
}

// Reconnect backoff bounds.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

func startListener(e *engine) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{e: e, cancel: cancel, done: make(chan struct{})}
	go l.run(ctx)
	return l
}

// close stops the loop and waits for its connection to be closed.
func (l *listener) close() {
	l.cancel()
	<-l.done
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := listenBackoffMin
	for {
		err := l.session(ctx, func() { backoff = listenBackoffMin })
		if ctx.Err() != nil {
			return
		}
		wait := backoffJitter(backoff)
		l.e.log.Warn("queen: listen connection lost; reconnecting", "err", err, "backoff", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, listenBackoffMax)
	}
}

// session connects, listens and delivers until the connection fails or ctx
// ends. After each (re)subscribe every waiter rescans: notifications sent
// while no connection listened are gone.
func (l *listener) session(ctx context.Context, connected func()) error {
	e := l.e
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{e.sql.Channel}.Sanitize()); err != nil {
		return err
	}
	connected()
	e.wake.wakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		e.wake.remote(n.Payload)
	}
}

// remote delivers a notification from any process (this one included; the
// extra wake costs one empty claim): lines of "tenant/queue", or "*" for
// every queue.
func (h *wakeHub) remote(payload string) {
	if payload == maintenanceNotice {
		h.e.refreshMaintenance(h.e.ctx)
		return
	}
	if payload == "*" {
		h.wakeAll()
		return
	}
	for line := range strings.Lines(payload) {
		line = strings.TrimSuffix(line, "\n")
		t, q, ok := strings.Cut(line, "/")
		if !ok {
			continue
		}
		tenant, err := uuid.FromString(t)
		if err != nil {
			continue
		}
		h.deliver(queueKey{tenant, q})
	}
}

// wakeAll wakes every parked waiter without hints, so each rescans.
func (h *wakeHub) wakeAll() {
	h.mu.Lock()
	keys := make([]queueKey, 0, len(h.waiters))
	for k := range h.waiters {
		keys = append(keys, k)
	}
	h.mu.Unlock()
	for _, k := range keys {
		h.deliver(k)
	}
}
