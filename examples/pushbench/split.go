package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// split separates an idle push's time over a single-row INSERT's into the
// statement's and the client's: commits as configured (fsync and
// synchronous_commit on by default), one at a time on one client's pool,
// alternating blocks of 100 calls of three kinds: the INSERT, the isolated
// push's statement (AppendSegment, as the client sends it, caught by a
// tracer) run through pgx directly, and Push. Each kind's p50 and the
// process's CPU per call (getrusage over its blocks: every goroutine of
// the client, the notifier's included) are printed.
func split(ctx context.Context, url string, payload []byte) error {
	stmt, err := appendStatement(ctx, url, "split", payload)
	if err != nil {
		return err
	}

	// The measured client: no tracer, so Push takes its usual path.
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: "pushbench"})
	if err != nil {
		return err
	}
	defer client.Close(ctx)
	pool := client.Pool()
	sch := pgx.Identifier{client.Schema()}.Sanitize()
	var pid int64
	if err := pool.QueryRow(ctx, "SELECT p.id FROM "+sch+".partitions p JOIN "+sch+".queues q ON q.id = p.queue_id "+
		"WHERE q.name = 'split' AND p.name = $1", queen.DefaultPartition).Scan(&pid); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS pushbench_rows (id bigserial, data bytea)"); err != nil {
		return err
	}
	var tenant [16]byte // the default tenant
	hashes := make([]byte, 16)
	args := []any{tenant, "split", queen.DefaultPartition, int32(1), hashes, payload, int32(0), int32(0), pid}
	qs := client.Queue("split")
	kinds := []struct {
		name string
		call func() error
	}{
		{"single-row INSERT commit", func() error {
			_, err := pool.Exec(ctx, "INSERT INTO pushbench_rows (data) VALUES ($1)", payload)
			return err
		}},
		{"the push's statement through pgx", func() error {
			rows, err := pool.Query(ctx, stmt, args...)
			if err != nil {
				return err
			}
			n := 0
			for rows.Next() {
				n++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("split: the statement wrote nothing (%d rows)", n)
			}
			return nil
		}},
		{"Push, one item", func() error {
			_, err := qs.Push(ctx, []queen.Item{{Data: payload}})
			return err
		}},
	}
	lat := make([][]time.Duration, len(kinds))
	cpu := make([]time.Duration, len(kinds))
	const block = 100
	for r := -1; r*block < *idleN; r++ { // round -1 unmeasured: plans cached, pool warm
		for j := range kinds {
			k := (j + max(r, 0)) % len(kinds)
			c0 := rusage()
			for range block {
				t := time.Now()
				if err := kinds[k].call(); err != nil {
					return fmt.Errorf("%s: %w", kinds[k].name, err)
				}
				if r >= 0 {
					lat[k] = append(lat[k], time.Since(t))
				}
			}
			if r >= 0 {
				cpu[k] += rusage() - c0
			}
		}
	}
	fmt.Printf("one at a time on one client's pool, %d calls each in alternating blocks of %d:\n", len(lat[0]), block)
	base := pct(lat[0], 50)
	for k, kd := range kinds {
		l := lat[k]
		fmt.Printf("  %-36s p25 %7s  p50 %7s  p75 %7s  p50 / INSERT's %.2f  client CPU %5.1f µs/call\n", kd.name,
			pct(l, 25).Round(time.Microsecond), pct(l, 50).Round(time.Microsecond), pct(l, 75).Round(time.Microsecond),
			float64(pct(l, 50))/float64(base), float64(cpu[k])/1e3/float64(len(l)))
	}
	return nil
}

// rusage is the process's user and system CPU time so far.
func rusage() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
