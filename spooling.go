package queen

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/zeebo/xxh3"
	"go.opentelemetry.io/otel/metric"

	"github.com/e03140bc/queen/dedup"
	"github.com/e03140bc/queen/fusion"
	"github.com/e03140bc/queen/spool"
)

// The disk spool takes what PostgreSQL could not: pushes whose bundle failed
// (reported Buffered instead of Failed), every push while maintenance mode
// is on, and what Close could not flush. A drain loop replays it through the
// normal push path, in order per partition. Replay is idempotent on the
// preserved transaction id within the queue's DedupWindow: give queues that
// must never duplicate a window longer than any outage you expect.

// spoolSlots bounds the directories tried when others are locked: each
// process needs its own, and a restarted process takes a free slot and
// drains what a previous run left in it.
const spoolSlots = 64

// defaultSpoolDir is per schema and per database, so two databases with the
// same schema name never replay into each other.
func defaultSpoolDir(schema string, pool *pgxpool.Pool) string {
	cc := pool.Config().ConnConfig
	id := fmt.Sprintf("%s:%d/%s", cc.Host, cc.Port, cc.Database)
	return filepath.Join(os.TempDir(), fmt.Sprintf("queen-spool-%s-%08x", schema, uint32(xxh3.HashString(id))))
}

func openSpool(e *engine) (*spool.Spool, error) {
	dir := e.cfg.SpoolDir
	if dir == "" {
		dir = defaultSpoolDir(e.cfg.Schema, e.pool)
	}
	for i := range spoolSlots {
		d := dir
		if i > 0 {
			d = fmt.Sprintf("%s.%d", dir, i)
		}
		sp, err := spool.Open(spool.Options{Dir: d, Logger: e.log})
		if errors.Is(err, spool.ErrLocked) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("queen: open spool %s: %w", d, err)
		}
		return sp, nil
	}
	return nil, fmt.Errorf("queen: open spool: all %d slots of %s are in use", spoolSlots, dir)
}

// spoolItems writes items to the spool and reports them Buffered; if the
// spool fails too they are Failed with both causes. Items from the drain
// itself are never re-spooled: they fail, and the drain retries them.
func (e *engine) spoolItems(items []*pushItem, key fusion.Key, cause error) {
	recs := make([]spool.Record, 0, len(items))
	var keep []*pushItem
	for _, it := range items {
		if it.noSpool {
			resolveFailed(it, cause)
			continue
		}
		keep = append(keep, it)
		recs = append(recs, spool.Record{
			Tenant: key.Tenant, Queue: key.Queue, Partition: key.Partition,
			TransactionID: it.txn, MessageID: it.id, Flags: it.flags, Payload: it.payload,
		})
	}
	if len(recs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
	defer cancel()
	if err := e.spool.Append(ctx, recs); err != nil {
		err = fmt.Errorf("queen: spool write failed (%w) after: %w", err, cause)
		for _, it := range keep {
			resolveFailed(it, err)
		}
		return
	}
	for _, it := range keep {
		it.resolve(PushResult{Status: Buffered, MessageID: it.id, Offset: -1})
	}
	e.drain.kick()
}

// drainer replays the spool in the background.
type drainer struct {
	e         *engine
	kickCh    chan struct{}
	stop      chan struct{}
	done      chan struct{}
	replayed  atomic.Int64
	failures  atomic.Int64
	lastDrain atomic.Int64 // unix nanos of the last pass that emptied the spool
}

const (
	drainEvery      = time.Second // also how often the maintenance flag is re-read
	drainBackoffMax = 5 * time.Second
)

func newDrainer(e *engine) *drainer {
	d := &drainer{e: e, kickCh: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go d.run()
	return d
}

func (d *drainer) kick() {
	select {
	case d.kickCh <- struct{}{}:
	default:
	}
}

func (d *drainer) close() {
	close(d.stop)
	<-d.done
}

func (d *drainer) run() {
	defer close(d.done)
	e := d.e
	backoff := time.Duration(0)
	t := time.NewTimer(0) // a first pass drains what a previous run left
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		case <-d.kickCh:
			if backoff > 0 {
				continue // a failing database is retried on the backoff timer
			}
		}
		e.refreshMaintenance(e.ctx)
		wait := drainEvery
		if !e.maintOn.Load() && e.spool.Stats().PendingRecords > 0 {
			n, err := e.spool.Replay(e.ctx, d.replay)
			d.replayed.Add(int64(n))
			switch {
			case err != nil && e.ctx.Err() == nil:
				d.failures.Add(1)
				backoff = min(max(2*backoff, 100*time.Millisecond), drainBackoffMax)
				wait = backoff
				e.log.Warn("queen: spool drain", "replayed", n, "retry_in", backoff, "err", err)
			default:
				backoff = 0
				if e.spool.Stats().PendingRecords == 0 {
					d.lastDrain.Store(time.Now().UnixNano())
				} else {
					wait = 0 // more arrived meanwhile
				}
			}
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(wait)
	}
}

// replay pushes one partition's records through fusion with their original
// message and transaction ids, and reports how many leading records are
// stored (Queued or Duplicate).
func (d *drainer) replay(ctx context.Context, batch []spool.Record) (int, error) {
	e := d.e
	if len(batch) == 0 {
		return 0, nil
	}
	if e.maintOn.Load() {
		return 0, errMaintenance
	}
	if !validName(batch[0].Queue) || !validName(batch[0].Partition) {
		return 0, spool.Permanent(fmt.Errorf("%w: queue %q partition %q", ErrInvalidName, batch[0].Queue, batch[0].Partition))
	}
	results := make([]PushResult, len(batch))
	items := make([]pushItem, len(batch))
	group := make([]*pushItem, len(batch))
	for i := range batch {
		r := &batch[i]
		it := &items[i]
		it.id, it.txn, it.payload, it.flags, it.res, it.noSpool = r.MessageID, r.TransactionID, r.Payload, r.Flags, &results[i], true
		it.hash = dedup.Sum(r.TransactionID)
		group[i] = it
	}
	key := fusion.Key{Tenant: batch[0].Tenant, Queue: batch[0].Queue, Partition: batch[0].Partition}
	one := func(yield func(fusion.Key, []*pushItem) bool) { yield(key, group) }
	if err := submitAndWait(ctx, e.push.fusion, 1, one); err != nil {
		return 0, err
	}
	for i, r := range results {
		switch r.Status {
		case Queued, Duplicate:
			continue
		}
		if errors.Is(r.Err, ErrEncryption) {
			return i, spool.Permanent(r.Err)
		}
		return i, r.Err
	}
	return len(batch), nil
}

var errMaintenance = errors.New("queen: maintenance mode is on")

// SetMaintenance switches maintenance mode for every process using this
// schema. On: every push goes to the local disk spool and is reported
// Buffered, without touching PostgreSQL, and spool drains pause. Off: the
// drains replay what was spooled. Other processes follow within about a
// second (at once when their LISTEN connection is up).
func (c *Client) SetMaintenance(ctx context.Context, on bool) error {
	e := c.e
	if e.isClosed() {
		return ErrClosed
	}
	if _, err := e.pool.Exec(ctx, e.sql.SetMaintenance, on); err != nil {
		return fmt.Errorf("queen: set maintenance: %w", err)
	}
	e.maintOn.Store(on)
	if _, err := e.pool.Exec(ctx, e.sql.Notify, e.sql.Channel, maintenanceNotice); err != nil {
		e.log.Warn("queen: notify maintenance change", "err", err)
	}
	if !on {
		e.drain.kick()
	}
	return nil
}

// Maintenance reports whether maintenance mode is on, as this process last
// saw it.
func (c *Client) Maintenance() bool { return c.e.maintOn.Load() }

// maintenanceNotice is the NOTIFY payload that makes listeners re-read the
// flag; it cannot be a "tenant/queue" line.
const maintenanceNotice = "!maintenance"

func (e *engine) refreshMaintenance(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.StatementTimeout)
	defer cancel()
	var on bool
	if err := e.pool.QueryRow(ctx, e.sql.GetMaintenance).Scan(&on); err != nil {
		return // keep the last known state while the database is away
	}
	if was := e.maintOn.Swap(on); was && !on {
		e.drain.kick()
	}
}

// spoolPush is Push in maintenance mode: straight to the spool.
func (e *engine) spoolPush(key fusion.Key, b *pushBatch) {
	for part, g := range b.groups {
		k := key
		k.Partition = part
		e.spoolItems(g, k, errMaintenance)
	}
}

// SpoolStats describes the disk spool and its drain.
type SpoolStats struct {
	Dir              string
	Files            int
	PendingRecords   int64 // spooled, not yet replayed
	PendingBytes     int64
	Appended         int64 // records spooled since Open
	Replayed         int64 // records replayed since Open
	QuarantinedFiles int   // files set aside after repeated permanent errors
	DrainFailures    int64 // drain passes that stopped on an error
	LastError        error
}

// SpoolStats reports the spool's depth and the drain's progress.
func (c *Client) SpoolStats() SpoolStats {
	e := c.e
	s := e.spool.Stats()
	return SpoolStats{
		Dir: e.spool.Dir(), Files: s.Files, PendingRecords: s.PendingRecords, PendingBytes: s.PendingBytes,
		Appended: s.Appended, Replayed: e.drain.replayed.Load(), QuarantinedFiles: s.QuarantinedFiles,
		DrainFailures: e.drain.failures.Load(), LastError: s.LastError,
	}
}

func registerSpoolMetrics(e *engine) (metric.Registration, error) {
	m := e.cfg.MeterProvider.Meter("github.com/e03140bc/queen")
	pending, err := m.Int64ObservableGauge("queen_spool_pending_records", metric.WithDescription("Records in the disk spool not yet replayed."))
	if err != nil {
		return nil, err
	}
	bytes, err := m.Int64ObservableGauge("queen_spool_pending_bytes", metric.WithUnit("By"))
	if err != nil {
		return nil, err
	}
	quarantined, err := m.Int64ObservableGauge("queen_spool_quarantined_files")
	if err != nil {
		return nil, err
	}
	replayed, err := m.Int64ObservableCounter("queen_spool_replayed", metric.WithDescription("Records replayed from the disk spool."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := e.spool.Stats()
		o.ObserveInt64(pending, s.PendingRecords)
		o.ObserveInt64(bytes, s.PendingBytes)
		o.ObserveInt64(quarantined, int64(s.QuarantinedFiles))
		o.ObserveInt64(replayed, e.drain.replayed.Load())
		return nil
	}, pending, bytes, quarantined, replayed)
}
