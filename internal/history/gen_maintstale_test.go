package history_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// The "maintstale" generator: a client whose own pool (Config.Pool) sits
// behind a slow network for one statement: the result of one of its
// periodic re-reads of the maintenance flag, which read "off", reaches it
// late. Meanwhile the client calls SetMaintenance(true), and once the late
// result has landed it pushes for a while: every push must be Buffered
// (maintenance-direct), since nobody turned the mode off. The delay is a
// pgx tracer holding the end of that one statement.
type maintStale struct {
	r    *run
	c    *queen.Client
	hold *flagHold
	n    int
}

const msProc = "maintstale"

// flagHold delays the end of one maintenance-flag read once armed.
type flagHold struct {
	armed   atomic.Bool
	reads   atomic.Int32 // flag reads ended, outside the held one
	mu      sync.Mutex
	held    chan struct{} // closed when the armed read is held
	release chan struct{}
}

type flagReadKey struct{}

func (f *flagHold) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "SELECT maintenance FROM") {
		return context.WithValue(ctx, flagReadKey{}, true)
	}
	return ctx
}

// TraceQueryEnd holds a read outside a transaction only: one inside Open's
// migration holds a row SetMaintenance needs.
func (f *flagHold) TraceQueryEnd(ctx context.Context, c *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(flagReadKey{}) == nil || c.PgConn().TxStatus() != 'I' {
		return
	}
	if f.armed.CompareAndSwap(true, false) {
		f.mu.Lock()
		held, release := f.held, f.release
		f.mu.Unlock()
		close(held)
		select { // bounded: a round that gave up must not hold it forever
		case <-release:
		case <-time.After(10 * time.Second):
		}
		return
	}
	f.reads.Add(1)
}

// arm holds the next flag read; the returned channels say it is held and
// end the hold.
func (f *flagHold) arm() (held <-chan struct{}, release func()) {
	h, r := make(chan struct{}), make(chan struct{})
	f.mu.Lock()
	f.held, f.release = h, r
	f.mu.Unlock()
	f.armed.Store(true)
	var once sync.Once
	return h, func() { once.Do(func() { f.armed.Store(false); close(r) }) }
}

// openMaintStale opens the generator's client on a pool of its own; before
// scanSpools reads r.spoolDirs.
func (r *run) openMaintStale(ctx context.Context) *maintStale {
	dir := r.t.TempDir()
	r.spoolDirs = append(r.spoolDirs, dir)
	cfg := r.config(msProc, dir)
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		r.t.Fatal(err)
	}
	hold := &flagHold{}
	pc.ConnConfig.Tracer = hold
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(pool.Close) // the client never closes a pool it was given
	cfg.DatabaseURL, cfg.Pool = "", pool
	return &maintStale{r: r, c: r.openCfg(ctx, cfg), hold: hold}
}

func (m *maintStale) loop(gen context.Context) {
	for m.n < 2 && gen.Err() == nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(gen), 30*time.Second)
		m.round(gen, ctx)
		cancel()
		select {
		case <-gen.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (m *maintStale) call(kind string, fn func() error) error {
	inv := m.r.rec.Invoke(history.Event{Proc: msProc, Op: history.OpCall, Kind: kind})
	err := fn()
	if err != nil {
		m.r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
	} else {
		m.r.rec.Done(inv, history.OK, history.Event{})
	}
	return err
}

func (m *maintStale) round(gen, ctx context.Context) {
	if !waitUntil(5*time.Second, func() bool { return !m.c.Maintenance() && m.c.SpoolStats().PendingRecords == 0 }) {
		return
	}
	m.n++
	stage := "set up"
	var buffered, stored int
	defer func() {
		m.r.t.Logf("staleflag: round %d: %s; %d pushes buffered, %d stored", m.n, stage, buffered, stored)
	}()
	q := fmt.Sprintf("ms-%d", m.n)
	if m.c.Queue(q).Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}) != nil {
		return
	}
	m.r.addQueue(q, history.QueueInfo{Deduped: true, Groups: []string{""}})
	// Alone: another generator's window ending would turn the mode off for
	// this client too, and excuse what it pushes. TryLock, polled: a
	// blocked Lock would hold off new shared holders, and one window (the
	// nemesis's) waits on another generator that may be taking one.
	locked := false
	for deadline := time.Now().Add(10 * time.Second); !locked && time.Now().Before(deadline) && gen.Err() == nil; {
		if locked = m.r.maintMu.TryLock(); !locked {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !locked {
		stage = "other maintenance windows kept running"
		return
	}
	defer m.r.maintMu.Unlock() // after the deferred SetMaintenance(false) below
	held, release := m.hold.arm()
	defer release()
	select { // the drain's re-read, once a second, read "off" and is held
	case <-held:
	case <-time.After(5 * time.Second):
		stage = "no flag read held"
		return
	}
	fault := m.r.rec.Invoke(history.Event{Proc: msProc, Op: history.OpFault, Kind: "maintenance"})
	m.r.faults.Add(1)
	defer m.r.rec.Done(fault, history.OK, history.Event{})
	before := m.hold.reads.Load()
	if m.call(history.CallMaintenanceOn, func() error { return m.c.SetMaintenance(ctx, true) }) != nil {
		stage = "SetMaintenance(true) failed"
		return
	}
	defer func() {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if m.call(history.CallMaintenanceOff, func() error { return m.c.SetMaintenance(context.Background(), false) }) == nil {
				return
			}
		}
	}()
	// The NOTIFY's re-read ("on") first, if it need not wait for the held one.
	if !waitUntil(2*time.Second, func() bool { return m.hold.reads.Load() > before }) {
		stage = "no other flag read meanwhile"
	} else {
		stage = "another flag read meanwhile"
	}
	release()
	for i := 0; i < 10 && gen.Err() == nil; i++ {
		tx := fmt.Sprintf("%s/%d", q, i)
		items := []queen.Item{{Partition: "p", TransactionID: tx, Data: payload(q, tx)}}
		inv := m.r.rec.Invoke(history.Event{Proc: msProc, Op: history.OpPush, Queue: q, Items: histItems(items)})
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := m.c.Queue(q).Push(pctx, items)
		cancel()
		if err != nil {
			m.r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		} else {
			m.r.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
			if res[0].Status == queen.Buffered {
				buffered++
			} else {
				stored++
			}
		}
		time.Sleep(30 * time.Millisecond)
	}
}
