// Package wake tells parked consumers about committed pushes: in this
// process at once, in others through one NOTIFY per tick listing the
// queues, received by a listener on a dedicated connection. It owns its
// goroutines (the notifier and the listen loop) and reaches the database
// only through the Execer and connection config it is given.
package wake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"iter"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Interval bounds the NOTIFY rate: at most one per interval, listing every
// queue committed to since the last, so a hot queue costs other processes
// one notification per tick rather than one per push. Wakes in this
// process are not held back by it.
const Interval = 5 * time.Millisecond

// MaintenanceNotice is the NOTIFY payload that makes listeners re-read the
// schema's maintenance flag (Config.OnMaintenance); it cannot be a
// "tenant/queue" line.
const MaintenanceNotice = "!maintenance"

// scheduledLine starts a payload line telling listeners that a message was
// scheduled, due at the Unix milliseconds that follow
// (Config.OnScheduled). An older listener skips it: it has no "/".
const scheduledLine = "!scheduled "

// notifyMax keeps the payload under PostgreSQL's 8000-byte NOTIFY limit.
const notifyMax = 7900

// originLine starts a hub's payload: the sending hub's id, so the hub
// that sent it skips it (its own waiters were woken at the commit). An
// older listener skips the line (it has no "/") and delivers the rest; a
// payload without it (PushTx's, an older sender's) is delivered.
const originLine = "!from "

// Execer runs a statement; a *pgxpool.Pool is one.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Config is what a Hub needs of its client.
type Config struct {
	Pool Execer
	// Notify is the statement sending a notification, run outside any
	// transaction: $1 the channel, $2 the payload.
	Notify  string
	Channel string
	// Timeout bounds each NOTIFY (the client's StatementTimeout).
	Timeout time.Duration
	Log     *slog.Logger
	// OnMaintenance runs when a MaintenanceNotice arrives.
	OnMaintenance func()
	// OnScheduled runs when a notification says a message was scheduled,
	// with its due time (zero: unknown, look now).
	OnScheduled func(due time.Time)
}

// QueueKey names a queue of a tenant.
type QueueKey struct {
	Tenant uuid.UUID
	Queue  string
}

// Line is the queue's line in a notification payload; a push in a
// transaction sends it alone.
func (k QueueKey) Line() string { return k.Tenant.String() + "/" + k.Queue + "\n" }

// Waiter is a parked consumer of one queue. hints collects the partitions
// that received data since it last looked.
type Waiter struct {
	key   QueueKey
	ch    chan struct{}
	mu    sync.Mutex
	hints map[string]struct{}
}

// C receives a value when the queue may have something to claim; wakes
// coalesce.
func (w *Waiter) C() <-chan struct{} { return w.ch }

// TakeHints returns and clears the partitions pushed to since the last call.
func (w *Waiter) TakeHints() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.hints))
	for p := range w.hints {
		out = append(out, p)
	}
	clear(w.hints)
	return out
}

// Hub tells parked consumers about committed pushes: in this process
// at once, in others through one NOTIFY per tick listing the queues.
type Hub struct {
	cfg     Config
	origin  string // the payload's first line: originLine and this hub's id
	mu      sync.Mutex
	toSend  map[QueueKey]struct{} // delivered here, not yet notified
	dueSend time.Time             // the earliest due time scheduled and not yet notified
	waiters map[QueueKey]map[*Waiter]struct{}
	send    chan struct{}   // toSend became non-empty
	ctx     context.Context // ends at close, cutting a NOTIFY short
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

// New starts a hub whose notifier runs until Close or until ctx ends.
func New(ctx context.Context, cfg Config) *Hub {
	var id [8]byte
	_, _ = rand.Read(id[:])
	h := &Hub{
		cfg:     cfg,
		origin:  originLine + hex.EncodeToString(id[:]) + "\n",
		toSend:  make(map[QueueKey]struct{}),
		waiters: make(map[QueueKey]map[*Waiter]struct{}),
		send:    make(chan struct{}, 1),
	}
	h.ctx, h.stop = context.WithCancel(ctx)
	h.wg.Go(h.notifier)
	return h
}

// Pushed records a commit to a partition of queue; called by the flush
// after commit. It wakes the local waiters of the queue itself (their
// one-slot channels and hint sets coalesce), so a local consumer never
// waits for a NOTIFY round trip, and it wakes the notifier only when the
// queue is the first of a tick: an isolated push hands off to no other
// goroutine.
func (h *Hub) Pushed(tenant uuid.UUID, queue, partition string) {
	h.record(QueueKey{tenant, queue}, partition, true)
}

// PushedAll is Pushed for each queue and partition of seq (a bundle's
// segments), under one lock.
func (h *Hub) PushedAll(seq iter.Seq2[QueueKey, string]) { h.recordAll(seq, true) }

// Woken wakes the queue's consumers, here and (by the next NOTIFY) in
// other processes, without partition hints: something other than a push
// made it claimable (Resume, a requeue). Called after that committed.
func (h *Hub) Woken(tenant uuid.UUID, queue string) {
	h.record(QueueKey{tenant, queue}, "", false)
}

// Scheduled queues, for the next NOTIFY, that a message due at due was
// scheduled, so other processes' movers look then. Called after commit.
func (h *Hub) Scheduled(due time.Time) {
	h.mu.Lock()
	first := len(h.toSend) == 0 && h.dueSend.IsZero()
	if h.dueSend.IsZero() || due.Before(h.dueSend) {
		h.dueSend = due
	}
	h.mu.Unlock()
	if first {
		select {
		case h.send <- struct{}{}:
		default:
		}
	}
}

// record wakes the local waiters of qk and queues it for the next NOTIFY.
func (h *Hub) record(qk QueueKey, partition string, hint bool) {
	h.recordAll(func(yield func(QueueKey, string) bool) { yield(qk, partition) }, hint)
}

// recordAll is record for each queue and partition of seq, under one lock;
// a run of one queue marks it to send once.
func (h *Hub) recordAll(seq iter.Seq2[QueueKey, string], hint bool) {
	h.mu.Lock()
	first := len(h.toSend) == 0 && h.dueSend.IsZero()
	var last QueueKey
	n := 0
	for qk, partition := range seq {
		h.wakeLocked(qk, partition, hint)
		if n == 0 || qk != last {
			h.toSend[qk] = struct{}{}
			last = qk
		}
		n++
	}
	h.mu.Unlock()
	if first && n > 0 {
		select {
		case h.send <- struct{}{}:
		default:
		}
	}
}

// wakeLocked wakes the local waiters of qk, with partition as a hint when
// hint is set. h.mu is held.
func (h *Hub) wakeLocked(qk QueueKey, partition string, hint bool) {
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
func (h *Hub) deliver(qk QueueKey) {
	h.mu.Lock()
	h.wakeLocked(qk, "", false)
	h.mu.Unlock()
}

// Subscribe parks a waiter on the queue until Unsubscribe.
func (h *Hub) Subscribe(tenant uuid.UUID, queue string) *Waiter {
	w := &Waiter{key: QueueKey{tenant, queue}, ch: make(chan struct{}, 1), hints: make(map[string]struct{})}
	h.mu.Lock()
	ws := h.waiters[w.key]
	if ws == nil {
		ws = make(map[*Waiter]struct{})
		h.waiters[w.key] = ws
	}
	ws[w] = struct{}{}
	h.mu.Unlock()
	return w
}

// Unsubscribe removes a waiter Subscribe parked.
func (h *Hub) Unsubscribe(w *Waiter) {
	h.mu.Lock()
	if ws := h.waiters[w.key]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(h.waiters, w.key)
		}
	}
	h.mu.Unlock()
}

// Parked counts the waiters, parked or looking.
func (h *Hub) Parked() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, ws := range h.waiters {
		n += len(ws)
	}
	return n
}

// notifier sends the NOTIFY on the leading edge: at once unless one went out
// less than Interval ago, in which case it waits out the interval.
func (h *Hub) notifier() {
	var last time.Time
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.send:
		}
		if wait := Interval - time.Since(last); wait > 0 {
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
		queues, due := h.toSend, h.dueSend
		h.toSend, h.dueSend = make(map[QueueKey]struct{}, len(queues)), time.Time{}
		h.mu.Unlock()
		if len(queues) > 0 || !due.IsZero() {
			h.notify(queues, due)
		}
	}
}

// notify sends one notification for everything committed in this tick, on
// its own short transaction: a NOTIFY inside the push transaction would
// serialize every committing bundle on the notification queue lock.
func (h *Hub) notify(batch map[QueueKey]struct{}, due time.Time) {
	var b strings.Builder
	b.WriteString(h.origin)
	if !due.IsZero() {
		b.WriteString(scheduledLine)
		b.WriteString(strconv.FormatInt(due.UnixMilli(), 10))
		b.WriteByte('\n')
	}
	for qk := range batch {
		b.WriteString(qk.Line())
	}
	payload := b.String()
	if len(payload) > notifyMax {
		payload = "*" // too many queues: every listener rescans
	}
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.Timeout)
	defer cancel()
	if _, err := h.cfg.Pool.Exec(ctx, h.cfg.Notify, h.cfg.Channel, payload); err != nil && ctx.Err() == nil {
		h.cfg.Log.Warn("queen: notify", "err", err)
	}
}

// Close stops the notifier: commits not yet notified are not.
func (h *Hub) Close() {
	h.stop()
	h.wg.Wait()
}

// Remote delivers a notification from any process: lines of
// "tenant/queue", or "*" for every queue, or MaintenanceNotice. One this hub
// sent is dropped: its waiters were woken and its mover told at the commit,
// and a second wake would cost each an empty claim.
func (h *Hub) Remote(payload string) {
	if strings.HasPrefix(payload, h.origin) {
		return
	}
	if payload == MaintenanceNotice {
		if h.cfg.OnMaintenance != nil {
			h.cfg.OnMaintenance()
		}
		return
	}
	if payload == "*" {
		// Too much to list: it may have held a scheduled line.
		if h.cfg.OnScheduled != nil {
			h.cfg.OnScheduled(time.Time{})
		}
		h.WakeAll()
		return
	}
	for line := range strings.Lines(payload) {
		line = strings.TrimSuffix(line, "\n")
		if ms, ok := strings.CutPrefix(line, scheduledLine); ok {
			if n, err := strconv.ParseInt(ms, 10, 64); err == nil && h.cfg.OnScheduled != nil {
				h.cfg.OnScheduled(time.UnixMilli(n))
			}
			continue
		}
		t, q, ok := strings.Cut(line, "/")
		if !ok {
			continue
		}
		tenant, err := uuid.FromString(t)
		if err != nil {
			continue
		}
		h.deliver(QueueKey{tenant, q})
	}
}

// WakeAll wakes every parked waiter without hints, so each rescans.
func (h *Hub) WakeAll() {
	h.mu.Lock()
	keys := make([]QueueKey, 0, len(h.waiters))
	for k := range h.waiters {
		keys = append(keys, k)
	}
	h.mu.Unlock()
	for _, k := range keys {
		h.deliver(k)
	}
}
