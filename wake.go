package queen

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/fusion"
)

// wakeInterval bounds the NOTIFY rate: at most one per interval, listing
// every queue committed to since the last, so a hot queue costs other
// processes one notification per tick rather than one per push. Wakes in
// this process are not held back by it.
const wakeInterval = 5 * time.Millisecond

type queueKey struct {
	tenant uuid.UUID
	queue  string
}

// waiter is a parked consumer of one queue. hints collects the partitions
// that received data since it last looked.
type waiter struct {
	key   queueKey
	ch    chan struct{}
	mu    sync.Mutex
	hints map[string]struct{}
}

// takeHints returns and clears the partitions pushed to since the last call.
func (w *waiter) takeHints() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.hints))
	for p := range w.hints {
		out = append(out, p)
	}
	clear(w.hints)
	return out
}

// wakeHub tells parked consumers about committed pushes: in this process
// at once, in others through one NOTIFY per tick listing the queues.
type wakeHub struct {
	e       *engine
	mu      sync.Mutex
	toSend  map[queueKey]struct{} // delivered here, not yet notified
	waiters map[queueKey]map[*waiter]struct{}
	send    chan struct{}   // toSend became non-empty
	ctx     context.Context // ends at close, cutting a NOTIFY short
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

func newWakeHub(e *engine) *wakeHub {
	h := &wakeHub{
		e:       e,
		toSend:  make(map[queueKey]struct{}),
		waiters: make(map[queueKey]map[*waiter]struct{}),
		send:    make(chan struct{}, 1),
	}
	h.ctx, h.stop = context.WithCancel(e.ctx)
	h.wg.Go(h.notifier)
	return h
}

// pushed records a commit to key; called by the flush after commit. It
// wakes the local waiters of the queue itself (their one-slot channels and
// hint sets coalesce), so a local consumer never waits for a NOTIFY round
// trip, and it wakes the notifier only when the queue is the first of a
// tick: an isolated push hands off to no other goroutine.
func (h *wakeHub) pushed(k fusion.Key) {
	h.record(queueKey{k.Tenant, k.Queue}, k.Partition, true)
}

// woken wakes the queue's consumers, here and (by the next NOTIFY) in
// other processes, without partition hints: something other than a push
// made it claimable (Resume, a requeue). Called after that committed.
func (h *wakeHub) woken(tenant uuid.UUID, queue string) {
	h.record(queueKey{tenant, queue}, "", false)
}

// record wakes the local waiters of qk and queues it for the next NOTIFY.
func (h *wakeHub) record(qk queueKey, partition string, hint bool) {
	h.mu.Lock()
	h.wakeLocked(qk, partition, hint)
	first := len(h.toSend) == 0
	h.toSend[qk] = struct{}{}
	h.mu.Unlock()
	if first {
		select {
		case h.send <- struct{}{}:
		default:
		}
	}
}

// wakeLocked wakes the local waiters of qk, with partition as a hint when
// hint is set. h.mu is held.
func (h *wakeHub) wakeLocked(qk queueKey, partition string, hint bool) {
	for w := range h.waiters[qk] {
		if hint {
			w.mu.Lock()
			w.hints[partition] = struct{}{}
			w.mu.Unlock()
		}
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}

// deliver wakes the local waiters of qk without a hint (a notification
// from another process).
func (h *wakeHub) deliver(qk queueKey) {
	h.mu.Lock()
	h.wakeLocked(qk, "", false)
	h.mu.Unlock()
}

func (h *wakeHub) subscribe(tenant uuid.UUID, queue string) *waiter {
	w := &waiter{key: queueKey{tenant, queue}, ch: make(chan struct{}, 1), hints: make(map[string]struct{})}
	h.mu.Lock()
	ws := h.waiters[w.key]
	if ws == nil {
		ws = make(map[*waiter]struct{})
		h.waiters[w.key] = ws
	}
	ws[w] = struct{}{}
	h.mu.Unlock()
	return w
}

func (h *wakeHub) unsubscribe(w *waiter) {
	h.mu.Lock()
	if ws := h.waiters[w.key]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(h.waiters, w.key)
		}
	}
	h.mu.Unlock()
}

// notifier sends the NOTIFY on the leading edge: at once unless one went out
// less than wakeInterval ago, in which case it waits out the interval.
func (h *wakeHub) notifier() {
	var last time.Time
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.send:
		}
		if wait := wakeInterval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-h.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		last = time.Now()
		h.mu.Lock()
		queues := h.toSend
		h.toSend = make(map[queueKey]struct{}, len(queues))
		h.mu.Unlock()
		if len(queues) > 0 {
			h.notify(queues)
		}
	}
}

// notifyMax keeps the payload under PostgreSQL's 8000-byte NOTIFY limit.
const notifyMax = 7900

// notify sends one notification for everything committed in this tick, on
// its own short transaction: a NOTIFY inside the push transaction would
// serialize every committing bundle on the notification queue lock.
func (h *wakeHub) notify(batch map[queueKey]struct{}) {
	var b strings.Builder
	for qk := range batch {
		b.WriteString(qk.tenant.String())
		b.WriteByte('/')
		b.WriteString(qk.queue)
		b.WriteByte('\n')
	}
	payload := b.String()
	if len(payload) > notifyMax {
		payload = "*" // too many queues: every listener rescans
	}
	ctx, cancel := context.WithTimeout(h.ctx, h.e.cfg.StatementTimeout)
	defer cancel()
	if _, err := h.e.pool.Exec(ctx, h.e.sql.Notify, h.e.sql.Channel, payload); err != nil && ctx.Err() == nil {
		h.e.log.Warn("queen: notify", "err", err)
	}
}

func (h *wakeHub) close() {
	h.stop()
	h.wg.Wait()
}
