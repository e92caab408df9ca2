//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/queentest/pgcluster"
)

// PgQ (Skype's queue, the pgq 3 extension, with its C insert path and its
// ticker daemon pgqd) beside queen. It lives in a database of its own,
// bench_pgq, of the same cluster. A PgQ consumer sees events only in
// batches between two ticks, so the drain loads its backlog with a tick
// after every 1000 events (batches of 1000, like queen's Batch 1000), and
// the end-to-end scenarios run pgqd against the cluster.

const pgqDB = "bench_pgq"

// pgqDrainBatch is the events per tick of the drain's backlog.
const pgqDrainBatch = 1000

// pgqE2ECase is one PgQ end-to-end row: pgqd's ticker_period and, when set,
// the queue's ticker_max_lag and ticker_idle_period.
type pgqE2ECase struct {
	key         string
	period      time.Duration
	maxLag      string
	idlePeriod  string
	description string
}

var pgqE2ECases = []pgqE2ECase{
	{key: "pgq-e2e-100ms", period: 100 * time.Millisecond,
		description: "pgqd ticker_period 0.1 s, queue ticker settings at their defaults (max_count 500, max_lag 3 s, idle_period 1 min)"},
	{key: "pgq-e2e-10ms", period: 10 * time.Millisecond, maxLag: "10 milliseconds", idlePeriod: "100 milliseconds",
		description: "pgqd ticker_period 0.01 s, queue ticker_max_lag 10 ms, ticker_idle_period 100 ms"},
}

// pgqE2ERate is the offered rate of the PgQ end-to-end scenarios.
const pgqE2ERate = 1000

// pgqPollSleep is how long the consumer sleeps when next_batch has no
// batch yet (PgQ has no wake-up; its own consumers sleep loop_delay, 1 s by
// default, which would measure the sleep rather than PgQ).
const pgqPollSleep = 2 * time.Millisecond

// pgqMissing says why PgQ cannot run here, or "" when it can: the pgq
// extension in the server and pgqd on PATH.
func (b *bench) pgqMissing(ctx context.Context) string {
	var ok bool
	if err := b.base.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pgq')").Scan(&ok); err != nil {
		return "checking for the pgq extension: " + err.Error()
	}
	var missing []string
	if !ok {
		missing = append(missing, "the pgq extension is not installed in this PostgreSQL")
	}
	if _, err := exec.LookPath("pgqd"); err != nil {
		missing = append(missing, "pgqd is not on PATH")
	}
	if len(missing) == 0 {
		return ""
	}
	return strings.Join(missing, "; ") + " (Debian: apt-get install postgresql-NN-pgq3 pgqd)"
}

// ensurePgQ installs PgQ with apt-get when it is missing and this process
// runs as root; it runs before the bench starts its cluster. It only
// prints: a scenario without PgQ reports itself unavailable.
func ensurePgQ(ctx context.Context) {
	bin, err := pgcluster.FindBinaries()
	if err != nil {
		return
	}
	major := filepath.Base(filepath.Dir(bin)) // /usr/lib/postgresql/15/bin
	if _, err := strconv.Atoi(major); err != nil {
		return // not Debian's layout: leave it to pgqMissing
	}
	_, cerr := os.Stat(filepath.Join("/usr/share/postgresql", major, "extension", "pgq.control"))
	_, perr := exec.LookPath("pgqd")
	if cerr == nil && perr == nil {
		return
	}
	if os.Geteuid() != 0 {
		fmt.Println("PgQ is not installed and this is not root: the PgQ scenarios will say so")
		return
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return
	}
	pkgs := []string{"postgresql-" + major + "-pgq3", "pgqd"}
	fmt.Printf("installing %s with apt-get ...\n", strings.Join(pkgs, " "))
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"install", "-y"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Printf("apt-get install failed (%v); the PgQ scenarios will say so\n%s\n", err, tail(out, 2000))
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// pgqPool returns a pool on bench_pgq, creating the database and the
// extension the first time.
func (b *bench) pgqPool(ctx context.Context) (*pgxpool.Pool, error) {
	if b.pgq != nil {
		return b.pgq, nil
	}
	if _, err := b.base.Exec(ctx, "DROP DATABASE IF EXISTS "+pgqDB+" WITH (FORCE)"); err != nil {
		return nil, err
	}
	if _, err := b.base.Exec(ctx, "CREATE DATABASE "+pgqDB); err != nil {
		return nil, err
	}
	pc := b.base.Config().Copy()
	pc.ConnConfig.Database = pgqDB
	pc.MaxConns = 72
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "CREATE EXTENSION pgq"); err != nil {
		pool.Close()
		return nil, fmt.Errorf("CREATE EXTENSION pgq: %w", err)
	}
	var v string
	_ = pool.QueryRow(ctx, "SELECT extversion FROM pg_extension WHERE extname = 'pgq'").Scan(&v)
	b.pgqVersion = "PgQ " + v
	b.pgq = pool
	return pool, nil
}

// pgqFreshQueue creates the queue, dropping it first if it exists.
func pgqFreshQueue(ctx context.Context, pool *pgxpool.Pool, name string) error {
	if _, err := pool.Exec(ctx, "SELECT pgq.drop_queue($1, true) FROM pgq.queue WHERE queue_name = $1", name); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, "SELECT pgq.create_queue($1)", name)
	return err
}

// pgqCopy COPYs rows events into the queue's current event table in one
// transaction: PgQ's documented fast path (ev_id and ev_txid come from the
// table's defaults).
func pgqCopy(ctx context.Context, pool *pgxpool.Pool, queue string, rows int, data func(k int) string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var table string
		if err := tx.QueryRow(ctx, "SELECT pgq.current_event_table($1)", queue).Scan(&table); err != nil {
			return err
		}
		schema, name, ok := strings.Cut(table, ".")
		if !ok {
			return fmt.Errorf("pgq.current_event_table: unexpected %q", table)
		}
		now := time.Now()
		_, err := tx.CopyFrom(ctx, pgx.Identifier{schema, name}, []string{"ev_time", "ev_type", "ev_data"},
			pgx.CopyFromSlice(rows, func(k int) ([]any, error) {
				return []any{now, "ev", data(k)}, nil
			}))
		return err
	})
}

func (b *bench) pgqUnavailable(ctx context.Context, name string) (*pgxpool.Pool, *result, error) {
	if why := b.pgqMissing(ctx); why != "" {
		return nil, &result{Name: name, Unavailable: why}, nil
	}
	pool, err := b.pgqPool(ctx)
	return pool, nil, err
}

func (b *bench) payloadText(i int64) string { return string(b.payloads[i%int64(len(b.payloads))]) }

// pgqBatchCopy: COPY of 1000 events per transaction into
// pgq.current_event_table from 8 goroutines, like the COPY baseline.
func (b *bench) pgqBatchCopy(ctx context.Context) (*result, error) {
	name := "PgQ: COPY 1000 events into pgq.current_event_table per transaction, 8 goroutines"
	pool, r, err := b.pgqUnavailable(ctx, name)
	if r != nil || err != nil {
		return r, err
	}
	if err := pgqFreshQueue(ctx, pool, "batch_copy"); err != nil {
		return nil, err
	}
	n := int64(b.cfg.nBatch)
	lr, err := load(ctx, 8, n/batchSize, b.cfg.maxTime, func(_ int, i int64) error {
		base := i * batchSize
		return pgqCopy(ctx, pool, "batch_copy", batchSize, func(k int) string { return b.payloadText(base + int64(k)) })
	})
	if err != nil {
		return nil, err
	}
	r = lr.result(name, batchSize, n)
	r.Note = b.pgqVersion
	return r, nil
}

// pgqBatchInsert: pgq.insert_event 1000 times in one statement (the loop
// runs in the server, one round trip) per transaction, 8 goroutines.
func (b *bench) pgqBatchInsert(ctx context.Context) (*result, error) {
	name := "PgQ: pgq.insert_event ×1000 in one transaction, 8 goroutines"
	pool, r, err := b.pgqUnavailable(ctx, name)
	if r != nil || err != nil {
		return r, err
	}
	if err := pgqFreshQueue(ctx, pool, "batch_insert"); err != nil {
		return nil, err
	}
	data := make([][]string, 8)
	for g := range data {
		data[g] = make([]string, batchSize)
	}
	n := int64(b.cfg.nBatch)
	lr, err := load(ctx, 8, n/batchSize, b.cfg.maxTime, func(g int, i int64) error {
		d := data[g]
		for k := range d {
			d[k] = b.payloadText(i*batchSize + int64(k))
		}
		var got int64
		if err := pool.QueryRow(ctx, "SELECT count(pgq.insert_event($1, 'ev', d)) FROM unnest($2::text[]) AS d", "batch_insert", d).Scan(&got); err != nil {
			return err
		}
		if got != batchSize {
			return fmt.Errorf("pgq.insert_event: %d of %d events", got, batchSize)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r = lr.result(name, batchSize, n)
	r.Note = b.pgqVersion + "; the loop is SELECT count(pgq.insert_event(...)) FROM unnest($2): one statement, one round trip"
	return r, nil
}

// pgqSingle: one pgq.insert_event per transaction from 1000 goroutines (as
// queen's single-item scenario) over 64 connections (as the INSERT
// baseline).
func (b *bench) pgqSingle(ctx context.Context) (*result, error) {
	name := "PgQ: one pgq.insert_event per transaction, 1000 goroutines, 64 connections"
	pool, r, err := b.pgqUnavailable(ctx, name)
	if r != nil || err != nil {
		return r, err
	}
	if err := pgqFreshQueue(ctx, pool, "single"); err != nil {
		return nil, err
	}
	pc := pool.Config().Copy()
	pc.MaxConns = 64
	p64, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	defer p64.Close()
	n := int64(b.cfg.nSingle)
	lr, err := load(ctx, 1000, n, b.cfg.maxTime, func(_ int, i int64) error {
		_, err := p64.Exec(ctx, "SELECT pgq.insert_event($1, 'ev', $2)", "single", b.payloadText(i))
		return err
	})
	if err != nil {
		return nil, err
	}
	r = lr.result(name, 1, n)
	r.Note = b.pgqVersion
	return r, nil
}

// pgqPrep opens PgQ's database before a scenario's clock and CPU
// accounting start: CREATE DATABASE and CREATE EXTENSION are not PgQ's
// cost per message. It does nothing when PgQ is missing (the scenario then
// says so).
func (b *bench) pgqPrep(ctx context.Context) error {
	if b.pgqMissing(ctx) != "" {
		return nil
	}
	_, err := b.pgqPool(ctx)
	return err
}

const pgqDrainQueue = "drain"

// pgqDrainLoad loads the drain's backlog, untimed and outside the drain's
// CPU accounting (as queen's drain consumes what the batch scenario
// loaded): -n-drain events in COPY transactions of 1000, each followed by
// a tick, so that every batch holds 1000 events.
func (b *bench) pgqDrainLoad(ctx context.Context) error {
	if err := b.pgqPrep(ctx); err != nil || b.pgq == nil {
		return err
	}
	pool := b.pgq
	if err := pgqFreshQueue(ctx, pool, pgqDrainQueue); err != nil {
		return err
	}
	// A tick on every pgq.ticker call that has new events (max_count 1),
	// and no other (the load calls it after each 1000).
	if _, err := pool.Exec(ctx, `SELECT pgq.set_queue_config($1, 'ticker_max_count', '1'),
		pgq.set_queue_config($1, 'ticker_max_lag', '1 hour'), pgq.set_queue_config($1, 'ticker_idle_period', '1 hour')`,
		pgqDrainQueue); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "SELECT pgq.register_consumer($1, 'c')", pgqDrainQueue); err != nil {
		return err
	}
	target := int64(b.cfg.nDrain)
	t0 := time.Now()
	for i := int64(0); i < target; i += pgqDrainBatch {
		rows := int(min(pgqDrainBatch, target-i))
		if err := pgqCopy(ctx, pool, pgqDrainQueue, rows, func(k int) string { return b.payloadText(i + int64(k)) }); err != nil {
			return fmt.Errorf("loading: %w", err)
		}
		var tick *int64
		if err := pool.QueryRow(ctx, "SELECT pgq.ticker($1)", pgqDrainQueue).Scan(&tick); err != nil {
			return fmt.Errorf("loading: ticker: %w", err)
		}
		if tick == nil {
			return fmt.Errorf("loading: pgq.ticker made no tick after %d events", rows)
		}
	}
	b.pgqBacklog = target
	fmt.Printf("  loaded %s PgQ events for the drain in %.1fs (untimed)\n", fmtInt(float64(target)), time.Since(t0).Seconds())
	return nil
}

// pgqDrain: one consumer loops next_batch / get_batch_events /
// finish_batch over the backlog pgqDrainLoad left, until it has read them
// all and finished the last batch.
func (b *bench) pgqDrain(ctx context.Context) (*result, error) {
	name := "PgQ: one consumer, next_batch / get_batch_events / finish_batch, 1000 events per batch"
	pool, r, err := b.pgqUnavailable(ctx, name)
	if r != nil || err != nil {
		return r, err
	}
	const queue = pgqDrainQueue
	target := b.pgqBacklog
	if target == 0 {
		return &result{Name: name, Unavailable: "no backlog loaded"}, nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	dctx, cancelDrain := context.WithTimeout(ctx, b.cfg.maxTime)
	defer cancelDrain()
	var got, batches, bytes int64
	capped := false
	start := time.Now()
	for got < target {
		if dctx.Err() != nil {
			capped = ctx.Err() == nil
			break
		}
		var batch *int64
		if err := conn.QueryRow(dctx, "SELECT pgq.next_batch($1, 'c')", queue).Scan(&batch); err != nil {
			if dctx.Err() != nil {
				continue
			}
			return nil, err
		}
		if batch == nil {
			return nil, fmt.Errorf("next_batch: no batch after %d of %d events", got, target)
		}
		rows, err := conn.Query(dctx, "SELECT ev_id, ev_data FROM pgq.get_batch_events($1)", *batch)
		if err != nil {
			if dctx.Err() != nil {
				continue
			}
			return nil, err
		}
		var id int64
		var data []byte
		_, err = pgx.ForEachRow(rows, []any{&id, &data}, func() error {
			got++
			bytes += int64(len(data))
			return nil
		})
		if err != nil {
			if dctx.Err() != nil {
				continue
			}
			return nil, err
		}
		if _, err := conn.Exec(dctx, "SELECT pgq.finish_batch($1)", *batch); err != nil {
			if dctx.Err() != nil {
				continue
			}
			return nil, err
		}
		batches++
	}
	el := time.Since(start)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return &result{
		Name: name, Msgs: min(got, target), Target: target, Seconds: el.Seconds(), Capped: capped,
		Note: fmt.Sprintf("%s; %d batches finished, %s bytes of ev_data read", b.pgqVersion, batches, fmtInt(float64(bytes))),
	}, nil
}

// pgqd runs the ticker daemon against bench_pgq with a config file in a
// temp dir; stop ends it (SIGINT, then SIGKILL after 10 s).
func (b *bench) pgqd(ctx context.Context, period time.Duration) (stop func() error, err error) {
	dir, err := os.MkdirTemp("", "bench-pgqd-")
	if err != nil {
		return nil, err
	}
	cc := b.base.Config().ConnConfig
	conn := fmt.Sprintf("host=%s port=%d user=%s", cc.Host, cc.Port, cc.User)
	if cc.Password != "" {
		conn += " password=" + cc.Password
	}
	if cc.TLSConfig == nil {
		conn += " sslmode=disable"
	}
	ini := fmt.Sprintf(`[pgqd]
logfile = %s
pidfile = %s
base_connstr = %s
initial_database = %s
database_list = %s
ticker_period = %g
check_period = 60
retry_period = 30
maint_period = 120
`, filepath.Join(dir, "pgqd.log"), filepath.Join(dir, "pgqd.pid"), conn, pgqDB, pgqDB, period.Seconds())
	cfgPath := filepath.Join(dir, "pgqd.ini")
	if err := os.WriteFile(cfgPath, []byte(ini), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command("pgqd", "-q", cfgPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgqd: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return func() error {
		defer os.RemoveAll(dir)
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
			return nil
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			log, _ := os.ReadFile(filepath.Join(dir, "pgqd.log"))
			return fmt.Errorf("pgqd did not stop on SIGINT within 10 s; its log:\n%s", tail(log, 2000))
		}
	}, nil
}

// pgqE2E: pgq.insert_event, one per transaction, at 1,000 events/s on the
// open-loop schedule of the other end-to-end scenarios, while pgqd ticks
// and one consumer loops next_batch / get_batch_events / finish_batch
// (sleeping 2 ms when there is no batch); latency is scheduled send to the
// consumer reading the event.
func (b *bench) pgqE2E(c pgqE2ECase) func(context.Context) (*result, error) {
	return func(ctx context.Context) (*result, error) {
		name := fmt.Sprintf("PgQ: end to end at %s msgs/s, %s", fmtInt(pgqE2ERate), c.description)
		total := int64(float64(pgqE2ERate) * b.cfg.e2eDur.Seconds())
		if total <= 0 {
			return &result{Name: name, Unavailable: "-e2e-time is zero"}, nil
		}
		pool, r, err := b.pgqUnavailable(ctx, name)
		if r != nil || err != nil {
			return r, err
		}
		queue := strings.ReplaceAll(c.key, "-", "_")
		if err := pgqFreshQueue(ctx, pool, queue); err != nil {
			return nil, err
		}
		if c.maxLag != "" {
			if _, err := pool.Exec(ctx, "SELECT pgq.set_queue_config($1, 'ticker_max_lag', $2)", queue, c.maxLag); err != nil {
				return nil, err
			}
		}
		if c.idlePeriod != "" {
			if _, err := pool.Exec(ctx, "SELECT pgq.set_queue_config($1, 'ticker_idle_period', $2)", queue, c.idlePeriod); err != nil {
				return nil, err
			}
		}
		if _, err := pool.Exec(ctx, "SELECT pgq.register_consumer($1, 'c')", queue); err != nil {
			return nil, err
		}
		pc := pool.Config().Copy()
		pc.MaxConns = riverE2EConns // the senders' connections, as River's
		senders, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, err
		}
		defer senders.Close()
		rec := newE2ERecorder(total)
		var ticks atomic.Int64
		res, err := runE2E(ctx, name, e2eCase{rate: pgqE2ERate}, rec, func() (func() error, error) {
			stopPgqd, err := b.pgqd(ctx, c.period)
			if err != nil {
				return nil, err
			}
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- pgqConsume(cctx, pool, queue, rec, &ticks) }()
			return func() error {
				cancel()
				cerr := <-done
				return errors.Join(cerr, stopPgqd())
			}, nil
		}, func(seq, sched int64) error {
			_, err := senders.Exec(ctx, "SELECT pgq.insert_event($1, 'e2e', $2, $3, NULL, NULL, NULL)",
				queue, b.payloadText(seq), strconv.FormatInt(seq, 10)+":"+strconv.FormatInt(sched, 10))
			return err
		})
		if res != nil {
			res.Key = c.key
			res.Note = fmt.Sprintf("%s; %d batches; %s", b.pgqVersion, ticks.Load(), res.Note)
		}
		return res, err
	}
}

// pgqConsume loops next_batch / get_batch_events / finish_batch until ctx
// is done, recording each event (its ev_extra1 is "seq:sched").
func pgqConsume(ctx context.Context, pool *pgxpool.Pool, queue string, rec *e2eRecorder, batches *atomic.Int64) error {
	err := func() error {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		for ctx.Err() == nil {
			var batch *int64
			if err := conn.QueryRow(ctx, "SELECT pgq.next_batch($1, 'c')", queue).Scan(&batch); err != nil {
				return err
			}
			if batch == nil {
				time.Sleep(pgqPollSleep)
				continue
			}
			rows, err := conn.Query(ctx, "SELECT ev_extra1 FROM pgq.get_batch_events($1)", *batch)
			if err != nil {
				return err
			}
			var extra string
			_, err = pgx.ForEachRow(rows, []any{&extra}, func() error {
				s, t, ok := strings.Cut(extra, ":")
				seq, err1 := strconv.ParseInt(s, 10, 64)
				sched, err2 := strconv.ParseInt(t, 10, 64)
				if !ok || err1 != nil || err2 != nil {
					return fmt.Errorf("bad ev_extra1 %q", extra)
				}
				rec.record(seq, sched)
				return nil
			})
			if err != nil {
				return err
			}
			if _, err := conn.Exec(ctx, "SELECT pgq.finish_batch($1)", *batch); err != nil {
				return err
			}
			batches.Add(1)
		}
		return nil
	}()
	if ctx.Err() != nil {
		return nil // stopped
	}
	return fmt.Errorf("PgQ consumer: %w", err)
}
