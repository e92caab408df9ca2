package queen

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
)

// MaintenanceConfig tunes the background maintenance loop. One process at a
// time runs it per schema (an advisory lock elects it); every pass works in
// bounded steps, each holding one partition row briefly, so it never blocks
// pushes or pops for longer than one step.
type MaintenanceConfig struct {
	// Interval between passes. Defaults to 1s. Negative disables the loop
	// (Client.Maintain still runs a pass on demand).
	Interval time.Duration
	// IdlePartition is how long an empty partition must go unwritten before
	// it is forgotten (its offsets restart at 0 if it is pushed to again).
	// Defaults to 24h. Negative keeps partitions forever.
	IdlePartition time.Duration
	// HashFloor is the least time hash rows are kept, whatever the queue's
	// DedupWindow: acks by transaction id resolve through them. Defaults to
	// 10 minutes (and never less than the queue's LeaseTime).
	HashFloor time.Duration
	// StepPartitions is how many partitions (in id order, resuming where
	// the last pass stopped) one pass looks at. Defaults to 256.
	StepPartitions int
	// StepRows bounds the segments or hash rows one step deletes from one
	// partition. Defaults to 1000.
	StepRows int
}

func (m MaintenanceConfig) withDefaults() MaintenanceConfig {
	if m.Interval == 0 {
		m.Interval = time.Second
	}
	if m.IdlePartition == 0 {
		m.IdlePartition = 24 * time.Hour
	}
	if m.HashFloor <= 0 {
		m.HashFloor = 10 * time.Minute
	}
	if m.StepPartitions <= 0 {
		m.StepPartitions = 256
	}
	if m.StepRows <= 0 {
		m.StepRows = 1000
	}
	return m
}

// MaintenanceReport says what one pass did.
type MaintenanceReport struct {
	Ran               bool // false: another process holds the maintenance lock
	SegmentsDeleted   int
	HashRowsDeleted   int
	PartitionsPurged  int
	PartitionsVisited int
}

// maintainer runs passes on a ticker. Its cursors make successive passes
// walk on through the partitions instead of revisiting the first ones.
type maintainer struct {
	e      *engine
	cfg    MaintenanceConfig
	ctx    context.Context // ends at close, cutting a pass short
	cancel context.CancelFunc
	done   chan struct{}

	mu           sync.Mutex // one pass at a time in this process
	cursor       int64      // the last partition id of the previous window
	lagAt        time.Time
	lag          []lagRow
	lagReg       metric.Registration
	lagMessages  metric.Int64ObservableGauge
	lagSeconds   metric.Float64ObservableGauge
	lagSnapshotM sync.Mutex // guards lag against the metrics callback
}

type lagRow struct {
	tenant   uuid.UUID
	queue    string
	group    string
	messages int64
	seconds  float64
}

// lagEvery bounds how often the lag snapshot (a scan of every consumer row)
// is taken for the metrics.
const lagEvery = 10 * time.Second

func newMaintainer(e *engine, cfg MaintenanceConfig) (*maintainer, error) {
	m := &maintainer{e: e, cfg: cfg, done: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(e.ctx)
	if err := m.registerLagMetrics(); err != nil {
		return nil, err
	}
	go m.run()
	return m, nil
}

func (m *maintainer) run() {
	defer close(m.done)
	if m.cfg.Interval < 0 {
		<-m.ctx.Done()
		return
	}
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		if _, err := m.pass(m.ctx); err != nil && m.ctx.Err() == nil {
			m.e.log.Warn("queen: maintenance pass", "err", err)
		}
	}
}

func (m *maintainer) close() {
	m.cancel()
	<-m.done
	_ = m.lagReg.Unregister()
}

// pass runs one bounded pass if this process wins the maintenance lock.
func (m *maintainer) pass(ctx context.Context) (MaintenanceReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var rep MaintenanceReport
	e := m.e
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return rep, err
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", e.sql.MaintenanceLockKey).Scan(&got); err != nil || !got {
		return rep, err
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", e.sql.MaintenanceLockKey); err != nil {
			_ = conn.Conn().Close(context.Background()) // never leave the lock on a pooled connection
		}
	}()
	rep.Ran = true
	step := func(sql string, args ...any) (int, error) {
		ctx, cancel := context.WithTimeout(ctx, e.cfg.StatementTimeout)
		defer cancel()
		var n int
		err := conn.QueryRow(ctx, sql, args...).Scan(&n)
		return n, err
	}

	// A window of partitions after the cursor; only those with something due
	// (their oldest segment or hash row past its queue's limit, read through
	// the primary keys without locks) get a step, and a step skips a
	// partition a push holds rather than wait for it.
	window, err := m.ids(ctx, conn.Conn(), e.sql.MaintenanceWindow, m.cursor)
	if err != nil {
		return rep, err
	}
	m.cursor = nextCursor(window, m.cfg.StepPartitions)
	rep.PartitionsVisited += len(window)
	if len(window) > 0 {
		rows, err := conn.Query(ctx, e.sql.MaintenanceDue, window, m.cfg.HashFloor.Milliseconds(),
			max(m.cfg.IdlePartition.Milliseconds(), 0))
		if err != nil {
			return rep, err
		}
		type due struct {
			id             int64
			segments, txns bool
			keep           int64
			idle           bool
		}
		dues, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
			var d due
			err := r.Scan(&d.id, &d.segments, &d.txns, &d.keep, &d.idle)
			return d, err
		})
		if err != nil {
			return rep, err
		}
		for _, d := range dues {
			if d.segments {
				n, err := step(e.sql.RetentionStep, d.id, m.cfg.StepRows)
				if err != nil {
					return rep, fmt.Errorf("retention of partition %d: %w", d.id, err)
				}
				rep.SegmentsDeleted += n
			}
			if d.txns {
				n, err := step(e.sql.PurgeTxnsStep, d.id, d.keep, m.cfg.StepRows)
				if err != nil {
					return rep, fmt.Errorf("hash purge of partition %d: %w", d.id, err)
				}
				rep.HashRowsDeleted += n
			}
			if d.idle {
				var gone bool
				ctx, cancel := context.WithTimeout(ctx, e.cfg.StatementTimeout)
				err := conn.QueryRow(ctx, e.sql.PurgePartition, d.id, m.cfg.IdlePartition.Milliseconds()).Scan(&gone)
				cancel()
				if err != nil {
					return rep, fmt.Errorf("purge of partition %d: %w", d.id, err)
				}
				if gone {
					rep.PartitionsPurged++
				}
			}
		}
	}

	if time.Since(m.lagAt) >= lagEvery {
		m.lagAt = time.Now()
		if err := m.snapshotLag(ctx, conn.Conn()); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func (m *maintainer) ids(ctx context.Context, conn *pgx.Conn, sql string, arg int64) ([]int64, error) {
	rows, err := conn.Query(ctx, sql, arg, m.cfg.StepPartitions)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func (m *maintainer) snapshotLag(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, m.e.sql.LagByGroup)
	if err != nil {
		return err
	}
	lag, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lagRow, error) {
		var l lagRow
		err := r.Scan(&l.tenant, &l.queue, &l.group, &l.messages, &l.seconds)
		return l, err
	})
	if err != nil {
		return err
	}
	m.lagSnapshotM.Lock()
	m.lag = lag
	m.lagSnapshotM.Unlock()
	return nil
}

// Maintain runs one maintenance pass now: retention, hash-row purge and
// idle-partition purge, in bounded steps. It reports Ran false when another
// process holds the maintenance lock. The background loop calls the same.
func (c *Client) Maintain(ctx context.Context) (MaintenanceReport, error) {
	if c.e.isClosed() {
		return MaintenanceReport{}, ErrClosed
	}
	rep, err := c.e.maint.pass(ctx)
	if err != nil {
		return rep, fmt.Errorf("queen: maintenance: %w", err)
	}
	return rep, nil
}

func nextCursor(ids []int64, limit int) int64 {
	if len(ids) < limit || len(ids) == 0 {
		return 0 // wrapped: start over next pass
	}
	return ids[len(ids)-1]
}
