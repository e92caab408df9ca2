package wake

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/backoff"
)

// Listener receives the NOTIFYs that hubs of every process send on the
// schema's channel and hands them to this process's hub. It holds one
// dedicated connection outside the pool, so a busy pool never delays wakes
// and a caller-supplied pool loses no capacity.
type Listener struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Reconnect backoff bounds.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// Listen starts the listen loop: it connects with a copy of conn (which it
// does not keep), LISTENs on channel and delivers to h until Close.
func Listen(h *Hub, conn *pgx.ConnConfig, channel string, log *slog.Logger) *Listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{cancel: cancel, done: make(chan struct{})}
	go l.run(ctx, h, conn.Copy(), channel, log)
	return l
}

// Close stops the loop and waits for its connection to be closed.
func (l *Listener) Close() {
	l.cancel()
	<-l.done
}

func (l *Listener) run(ctx context.Context, h *Hub, cc *pgx.ConnConfig, channel string, log *slog.Logger) {
	defer close(l.done)
	wait := listenBackoffMin
	for {
		err := session(ctx, h, cc, channel, func() { wait = listenBackoffMin })
		if ctx.Err() != nil {
			return
		}
		d := backoff.Jitter(wait)
		log.Warn("queen: listen connection lost; reconnecting", "err", err, "backoff", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, listenBackoffMax)
	}
}

// session connects, listens and delivers until the connection fails or ctx
// ends. After each (re)subscribe every waiter rescans: notifications sent
// while no connection listened are gone.
func session(ctx context.Context, h *Hub, cc *pgx.ConnConfig, channel string, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	connected()
	h.WakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		h.Remote(n.Payload)
	}
}
