// Package maintain runs the background maintenance loop: retention,
// hash-row purge, idle-partition purge and dead-letter retention in bounded
// steps, one process per schema (an advisory lock elects it), the
// consumer-lag snapshot its gauges report and the samples ring the
// console charts. It owns its goroutine and reaches the database only
// through the Pool it is given.
package maintain

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/e03140bc/queen/internal/stmt"
)

// Config is the root's MaintenanceConfig with its defaults applied (the
// root documents each field).
type Config struct {
	Interval       time.Duration
	IdlePartition  time.Duration
	HashFloor      time.Duration
	StepPartitions int
	StepRows       int
}

// Report is the root's MaintenanceReport: what one pass did.
type Report struct {
	Ran                bool
	SegmentsDeleted    int
	HashRowsDeleted    int
	PartitionsPurged   int
	PartitionsVisited  int
	DeadLettersDeleted int
	MembersExpired     int
	Samples            int
}

// Pool hands out the connection a pass holds the maintenance lock on; a
// *pgxpool.Pool is one.
type Pool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Params is what a Maintainer needs of its client.
type Params struct {
	Pool          Pool
	SQL           *stmt.Set
	Timeout       time.Duration // bounds each step (the client's StatementTimeout)
	Log           *slog.Logger
	MeterProvider metric.MeterProvider
	Config        Config
	// MemberTTL is how long a consumer group member's row outlives its
	// last heartbeat before a pass deletes it.
	MemberTTL time.Duration
	// SampleWidth is the bucket of the samples ring, which holds
	// SampleSlots of them (the root's SampleInterval and SamplesKept);
	// either 0: no samples are taken.
	SampleWidth time.Duration
	SampleSlots int
	// Routed: the schema is on the Citus layout (Config.Citus), where the
	// lag snapshot reads through its routed statement.
	Routed bool
}

// Maintainer runs passes on a ticker. Its cursors make successive passes
// walk on through the partitions instead of revisiting the first ones.
type Maintainer struct {
	pool    Pool
	sql     *stmt.Set
	timeout time.Duration // each step's: the client's StatementTimeout
	log     *slog.Logger
	cfg     Config
	ttl     time.Duration   // members' (Params.MemberTTL)
	width   time.Duration   // the samples ring's bucket (Params.SampleWidth)
	slots   int             // and its length
	routed  bool            // Params.Routed
	ctx     context.Context // ends at close, cutting a pass short
	cancel  context.CancelFunc
	done    chan struct{}

	mu           sync.Mutex // one pass at a time in this process
	cursor       int64      // the last partition id of the previous window
	lagAt        time.Time
	lag          []stmt.LagRow
	dead         []stmt.DeadLetterCountRow
	lagTaken     time.Time // when lag and dead were read
	lagReg       metric.Registration
	lagMessages  metric.Int64ObservableGauge
	lagSeconds   metric.Float64ObservableGauge
	deadLetters  metric.Int64ObservableGauge
	lagSnapshotM sync.Mutex // guards lag and dead against the metrics callback
}

// lagEvery bounds how often the lag snapshot (a scan of every consumer row)
// and the dead-letter counts (of every dead letter's index entry) are taken
// for the metrics.
const lagEvery = 10 * time.Second

// lagStale is how old a snapshot the gauges still report: each process
// reports only what it read itself lately, so a process whose passes lose
// the lock to another's goes silent instead of repeating old numbers.
func (m *Maintainer) lagStale() time.Duration { return 3 * max(lagEvery, m.cfg.Interval) }

// New starts the loop (unless cfg.Interval is negative), which runs until
// Close or until ctx ends, and registers the lag gauges with mp.
func New(ctx context.Context, p Params) (*Maintainer, error) {
	m := &Maintainer{pool: p.Pool, sql: p.SQL, timeout: p.Timeout, log: p.Log, cfg: p.Config, ttl: p.MemberTTL,
		width: p.SampleWidth, slots: p.SampleSlots, routed: p.Routed, done: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(ctx)
	if err := m.registerLagMetrics(p.MeterProvider); err != nil {
		return nil, err
	}
	go m.run()
	return m, nil
}

func (m *Maintainer) run() {
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
		if _, err := m.Pass(m.ctx); err != nil && m.ctx.Err() == nil {
			m.log.Warn("queen: maintenance pass", "err", err)
		}
	}
}

// Close stops the loop, cutting a pass short, and unregisters the gauges.
func (m *Maintainer) Close() {
	m.cancel()
	<-m.done
	_ = m.lagReg.Unregister()
}

// Pass runs one bounded pass if this process wins the maintenance lock.
func (m *Maintainer) Pass(ctx context.Context) (Report, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var rep Report
	conn, err := m.pool.Acquire(ctx)
	if err != nil {
		return rep, err
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", m.sql.MaintenanceLockKey).Scan(&got); err != nil || !got {
		return rep, err
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", m.sql.MaintenanceLockKey); err != nil {
			_ = conn.Conn().Close(context.Background()) // never leave the lock on a pooled connection
		}
	}()
	rep.Ran = true
	// Each step is bounded by m.timeout.
	step := func(f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(ctx, m.timeout)
		defer cancel()
		return f(ctx)
	}

	// A window of partitions after the cursor; only those with something due
	// (their oldest segment or hash row past its queue's limit, read through
	// the primary keys without locks) get a step, and a step skips a
	// partition a push holds rather than wait for it.
	window, err := stmt.MaintenanceWindow(ctx, m.sql, conn, m.cursor, m.cfg.StepPartitions)
	if err != nil {
		return rep, err
	}
	m.cursor = nextCursor(window, m.cfg.StepPartitions)
	rep.PartitionsVisited += len(window)
	if len(window) > 0 {
		dues, err := stmt.MaintenanceDue(ctx, m.sql, conn, stmt.MaintenanceDueParams{Partitions: window,
			HashFloor: m.cfg.HashFloor, Idle: m.cfg.IdlePartition})
		if err != nil {
			return rep, err
		}
		for _, d := range dues {
			if d.Retention {
				var n int
				err := step(func(ctx context.Context) (err error) {
					n, err = stmt.RetentionStep(ctx, m.sql, conn, d.Partition, m.cfg.StepRows, d.HashKeep)
					return err
				})
				if err != nil {
					return rep, fmt.Errorf("retention of partition %d: %w", d.Partition, err)
				}
				rep.SegmentsDeleted += n
			}
			if d.Hashes {
				var n int
				err := step(func(ctx context.Context) (err error) {
					n, err = stmt.PurgeTxnsStep(ctx, m.sql, conn, d.Partition, d.HashKeep, m.cfg.StepRows)
					return err
				})
				if err != nil {
					return rep, fmt.Errorf("hash purge of partition %d: %w", d.Partition, err)
				}
				rep.HashRowsDeleted += n
			}
			if d.Idle {
				var gone bool
				err := step(func(ctx context.Context) (err error) {
					gone, err = stmt.PurgePartition(ctx, m.sql, conn, d.Partition, m.cfg.IdlePartition)
					return err
				})
				if err != nil {
					return rep, fmt.Errorf("purge of partition %d: %w", d.Partition, err)
				}
				if gone {
					rep.PartitionsPurged++
				}
			}
		}
	}

	// Dead letters past their queue's retention, at most StepRows a pass.
	var n int
	err = step(func(ctx context.Context) (err error) {
		n, err = stmt.DeadLetterRetentionStep(ctx, m.sql, conn, m.cfg.StepRows)
		return err
	})
	if err != nil {
		return rep, fmt.Errorf("dead-letter retention: %w", err)
	}
	rep.DeadLettersDeleted += n

	// Crashed members' rows, at most StepRows a pass.
	err = step(func(ctx context.Context) (err error) {
		n, err = stmt.ExpireMembers(ctx, m.sql, conn, m.ttl, m.cfg.StepRows)
		return err
	})
	if err != nil {
		return rep, fmt.Errorf("member expiry: %w", err)
	}
	rep.MembersExpired += n

	// The console's samples ring: a single-row probe but in the first pass
	// of each bucket (of whichever process runs it).
	if m.width > 0 && m.slots > 0 {
		err = step(func(ctx context.Context) (err error) {
			n, err = stmt.TakeSamples(ctx, m.sql, conn, m.width, m.slots)
			return err
		})
		if err != nil {
			return rep, fmt.Errorf("samples: %w", err)
		}
		rep.Samples += n
	}

	if time.Since(m.lagAt) >= lagEvery {
		m.lagAt = time.Now()
		if err := m.snapshotLag(ctx, conn.Conn()); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func (m *Maintainer) snapshotLag(ctx context.Context, conn *pgx.Conn) error {
	lag, err := stmt.LagByGroup(ctx, m.sql, conn, m.routed)
	if err != nil {
		return err
	}
	dead, err := stmt.DeadLetterCounts(ctx, m.sql, conn)
	if err != nil {
		return err
	}
	m.lagSnapshotM.Lock()
	m.lag, m.dead, m.lagTaken = lag, dead, time.Now()
	m.lagSnapshotM.Unlock()
	return nil
}

// registerLagMetrics registers the consumer lag gauges and the dead-letter
// gauge, read from the maintainer's last snapshot.
func (m *Maintainer) registerLagMetrics(mp metric.MeterProvider) error {
	meter := mp.Meter("github.com/e03140bc/queen")
	var err error
	if m.lagMessages, err = meter.Int64ObservableGauge("queen.consumer.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Messages behind per queue and consumer group (reported by the process running maintenance).")); err != nil {
		return err
	}
	if m.lagSeconds, err = meter.Float64ObservableGauge("queen.consumer.lag_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unconsumed message per queue and consumer group.")); err != nil {
		return err
	}
	if m.deadLetters, err = meter.Int64ObservableGauge("queen.queue.dead_letters", metric.WithUnit("{message}"),
		metric.WithDescription("Dead letters each queue holds (reported by the process running maintenance).")); err != nil {
		return err
	}
	if m.lagReg, err = meter.RegisterCallback(m.observe, m.lagMessages, m.lagSeconds, m.deadLetters); err != nil {
		return err
	}
	return nil
}

func (m *Maintainer) observe(_ context.Context, o metric.Observer) error {
	m.lagSnapshotM.Lock()
	defer m.lagSnapshotM.Unlock()
	if time.Since(m.lagTaken) > m.lagStale() {
		return nil
	}
	for _, r := range m.lag {
		attrs := metric.WithAttributes(attribute.String("queue", r.Queue), attribute.String("group", r.Group),
			attribute.String("tenant", r.Tenant.String()))
		o.ObserveInt64(m.lagMessages, r.Messages, attrs)
		o.ObserveFloat64(m.lagSeconds, r.Seconds, attrs)
	}
	for _, r := range m.dead {
		o.ObserveInt64(m.deadLetters, r.DeadLetters,
			metric.WithAttributes(attribute.String("queue", r.Queue), attribute.String("tenant", r.Tenant.String())))
	}
	return nil
}

func nextCursor(ids []int64, limit int) int64 {
	if len(ids) < limit || len(ids) == 0 {
		return 0 // wrapped: start over next pass
	}
	return ids[len(ids)-1]
}
