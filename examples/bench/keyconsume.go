//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// The per-key parallel Consume workload: keys × events with Item.Key over
// the queue's lanes, consumed by two processes (this program re-executed),
// each one Consume with Concurrency 8 and KeyConcurrency 64 and a handler
// that sleeps 1 ms. Every handler records its key, event and start and end
// times; after the drain the parent reads both processes' records and
// checks that no two handlers of one key overlapped and that each key's
// events started in order. Run with -keyconsume.
var kc struct {
	on       bool
	child    string // the records file of a child consumer
	keys     int
	events   int
	procs    int
	conc     int
	keyConc  int
	sleep    time.Duration
	maxTime  time.Duration
	childURL string
	schema   string
}

func init() {
	flag.BoolVar(&kc.on, "keyconsume", false, "run only the per-key parallel Consume workload (keyed lanes, 2 processes × Concurrency 8 × KeyConcurrency 64, 1 ms handlers, exclusion and order checked)")
	flag.StringVar(&kc.child, "keyconsume-child", "", "internal: consume as a child process, writing handler records to this file")
	flag.IntVar(&kc.keys, "keyconsume-keys", 100_000, "keyconsume: keys")
	flag.IntVar(&kc.events, "keyconsume-events", 5, "keyconsume: events per key")
	flag.IntVar(&kc.procs, "keyconsume-procs", 2, "keyconsume: consumer processes")
	flag.IntVar(&kc.conc, "keyconsume-concurrency", 8, "keyconsume: ConsumeOptions.Concurrency per process")
	flag.IntVar(&kc.keyConc, "keyconsume-key-concurrency", 64, "keyconsume: ConsumeOptions.KeyConcurrency")
	flag.DurationVar(&kc.sleep, "keyconsume-sleep", time.Millisecond, "keyconsume: handler sleep")
	flag.DurationVar(&kc.maxTime, "keyconsume-max-time", 5*time.Minute, "keyconsume: cap on the drain")
	flag.StringVar(&kc.childURL, "keyconsume-url", "", "internal: the child's database")
	flag.StringVar(&kc.schema, "keyconsume-schema", "bench_keyconsume", "internal: the child's schema")
}

// kcRecord is one handler run: 8 bytes key, 4 event, 8 start, 8 end (Unix ns).
const kcRecordSize = 28

func kcQueueName() string { return "keyconsume" }

// runKeyConsumeChild consumes until SIGTERM, then writes its records.
func runKeyConsumeChild(ctx context.Context) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: kc.childURL, Schema: kc.schema,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	defer c.Close(context.Background()) //nolint:errcheck
	var mu sync.Mutex
	recs := make([]byte, 0, 1<<20)
	var bad atomic.Value
	err = c.Queue(kcQueueName()).Consume(ctx, queen.ConsumeOptions{
		PopOptions:     queen.PopOptions{Batch: 1000},
		Concurrency:    kc.conc,
		KeyConcurrency: kc.keyConc,
	}, func(_ context.Context, m *queen.Message) error {
		start := time.Now().UnixNano()
		k, j, ok := lcParse(m.Data)
		if !ok || m.Key != keyName(k) {
			bad.Store(fmt.Sprintf("message %q has key %q", m.Data, m.Key))
		}
		time.Sleep(kc.sleep)
		end := time.Now().UnixNano()
		var b [kcRecordSize]byte
		binary.LittleEndian.PutUint64(b[0:], uint64(k))
		binary.LittleEndian.PutUint32(b[8:], uint32(j))
		binary.LittleEndian.PutUint64(b[12:], uint64(start))
		binary.LittleEndian.PutUint64(b[20:], uint64(end))
		mu.Lock()
		recs = append(recs, b[:]...)
		mu.Unlock()
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if v := bad.Load(); v != nil {
		return errors.New(v.(string))
	}
	mu.Lock()
	defer mu.Unlock()
	return os.WriteFile(kc.child, recs, 0o600)
}

func keyName(k int) string { return fmt.Sprintf("key-%07d", k) }

func runKeyConsume(ctx context.Context, cfg *config) error {
	url, dataDir := cfg.url, ""
	if url == "" {
		fmt.Println("starting PostgreSQL (production-like profile) ...")
		opts := pgcluster.Production()
		opts.Settings["max_connections"] = "200"
		cl, err := pgcluster.Start(ctx, opts)
		if err != nil {
			return err
		}
		defer cl.Close()
		url, dataDir = cl.URL, cl.DataDir
	}
	base, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer base.Close()
	if dataDir == "" {
		_ = base.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dataDir)
	}
	cond := startConditions(dataDir)
	if _, err := base.Exec(ctx, "DROP SCHEMA IF EXISTS "+kc.schema+" CASCADE"); err != nil {
		return err
	}
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: kc.schema,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	defer c.Close(context.Background()) //nolint:errcheck
	q := c.Queue(kcQueueName())
	total := kc.keys * kc.events

	// Load: 8 loaders, 1000 events per call, event j of every key before j+1.
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, lcLoaders)
	for l := range lcLoaders {
		wg.Go(func() {
			items := make([]queen.Item, 0, lcCall)
			for j := range kc.events {
				for k := l; k < kc.keys; k += lcLoaders {
					items = append(items, queen.Item{Key: keyName(k), Data: lcPayload(k, j)})
					if len(items) == lcCall || (j == kc.events-1 && k+lcLoaders >= kc.keys) {
						res, err := q.Push(ctx, items)
						if err == nil {
							err = checkPush(res, nil)
						}
						if err != nil {
							errs <- err
							return
						}
						items = items[:0]
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	load := time.Since(t0)
	fmt.Printf("keyconsume: %d keys × %d events loaded in %s (%s msgs/s)\n", kc.keys, kc.events,
		load.Round(time.Millisecond), fmtInt(float64(total)/load.Seconds()))

	// Drain: the child processes consume; the parent watches the lag.
	dir, err := os.MkdirTemp("", "keyconsume")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var children []*exec.Cmd
	var files []string
	t0 = time.Now()
	for i := range kc.procs {
		f := filepath.Join(dir, fmt.Sprintf("child-%d.rec", i))
		files = append(files, f)
		cmd := exec.CommandContext(ctx, self, "-keyconsume-child", f, "-keyconsume-url", url, "-keyconsume-schema", kc.schema,
			"-keyconsume-concurrency", fmt.Sprint(kc.conc), "-keyconsume-key-concurrency", fmt.Sprint(kc.keyConc),
			"-keyconsume-sleep", kc.sleep.String())
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		children = append(children, cmd)
	}
	defer func() {
		for _, cmd := range children {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		}
	}()
	deadline := time.Now().Add(kc.maxTime)
	var lag int64
	for {
		if err := base.QueryRow(ctx, `SELECT coalesce(sum(lag_messages), 0)::bigint FROM `+kc.schema+`.consumer_lag`).Scan(&lag); err != nil {
			return err
		}
		// Before the first claim the group has no cursor rows: no lag yet.
		var started bool
		if err := base.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+kc.schema+`.consumers)`).Scan(&started); err != nil {
			return err
		}
		if started && lag == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	drain := time.Since(t0)
	for _, cmd := range children {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, cmd := range children {
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("consumer process: %w", err)
		}
	}
	if lag > 0 {
		return fmt.Errorf("keyconsume: %d messages not consumed after %s", lag, kc.maxTime)
	}

	// Check the handlers' records of both processes together.
	type rec struct {
		j          int32
		start, end int64
	}
	perKey := make([][]rec, kc.keys)
	n := 0
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return err
		}
		r := bufio.NewReader(fh)
		var b [kcRecordSize]byte
		for {
			if _, err := io.ReadFull(r, b[:]); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				fh.Close()
				return err
			}
			k := int(binary.LittleEndian.Uint64(b[0:]))
			if k < 0 || k >= kc.keys {
				fh.Close()
				return fmt.Errorf("record of key %d", k)
			}
			perKey[k] = append(perKey[k], rec{int32(binary.LittleEndian.Uint32(b[8:])),
				int64(binary.LittleEndian.Uint64(b[12:])), int64(binary.LittleEndian.Uint64(b[20:]))})
			n++
		}
		fh.Close()
	}
	overlaps, disorder, missing := 0, 0, 0
	for _, rs := range perKey {
		slices.SortFunc(rs, func(a, b rec) int { return int(a.start - b.start) })
		seen := make(map[int32]bool, kc.events)
		for i, r := range rs {
			if i > 0 && r.start < rs[i-1].end {
				overlaps++
			}
			// A first delivery of event j must come after event j-1's.
			if !seen[r.j] {
				if r.j > 0 && !seen[r.j-1] {
					disorder++
				}
				seen[r.j] = true
			}
		}
		for j := range int32(kc.events) {
			if !seen[j] {
				missing++
			}
		}
	}
	rate := float64(total) / drain.Seconds()
	cond.end(dataDir)
	fmt.Printf("keyconsume: %d processes × Concurrency %d × KeyConcurrency %d, handler %s: %d messages (%d handler runs) in %s: %s msgs/s\n",
		kc.procs, kc.conc, kc.keyConc, kc.sleep, total, n, drain.Round(time.Millisecond), fmtInt(rate))
	fmt.Printf("keyconsume: overlapping handlers of one key %d, events started out of order %d, events never handled %d\n",
		overlaps, disorder, missing)
	if overlaps > 0 || disorder > 0 || missing > 0 {
		return errors.New("keyconsume: per-key exclusion or order violated")
	}
	return nil
}
