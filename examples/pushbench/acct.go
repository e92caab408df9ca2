package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
)

// acct accounts for the server's side of an idle push, one kind at a time:
// acctN calls back to back, each alone in flight, then the CPU the
// database's backends used per call (/proc/<pid>/schedstat, so only when
// the server runs on this machine) and, with pg_stat_statements loaded and
// tracking nested statements (the self-started cluster does so for this
// scenario), each statement's calls and mean execution time. The kinds: a
// single-row INSERT commit (the yardstick), a push to one known partition,
// to 100 known partitions in turn, to a queue with a dedup window (one
// item a call, and ten to another partition), and keyed items over 16
// lanes.
func acct(ctx context.Context, client *queen.Client, stats *pgxpool.Pool, payload []byte) error {
	pool := client.Pool()
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS pushbench_rows (id bigserial, data bytea)"); err != nil {
		return err
	}
	_, err := stats.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	pss := err == nil
	if pss {
		var track string
		_ = stats.QueryRow(ctx, "SHOW pg_stat_statements.track").Scan(&track)
		pss = track == "all"
	}
	if !pss {
		fmt.Println("  (pg_stat_statements with track = all not loaded: CPU only)")
	}
	dedup, keyed := client.Queue("acct-dedup"), client.Queue("acct-keyed")
	if err := dedup.Configure(ctx, queen.QueueOptions{DedupWindow: time.Minute}); err != nil {
		return err
	}
	if err := keyed.Configure(ctx, queen.QueueOptions{Lanes: 16}); err != nil {
		return err
	}
	one, rot := client.Queue("acct-one"), client.Queue("acct-rotate")
	type kind struct {
		name string
		call func(i int) error
	}
	kinds := []kind{
		{"single-row INSERT commit", func(int) error {
			_, err := pool.Exec(ctx, "INSERT INTO pushbench_rows (data) VALUES ($1)", payload)
			return err
		}},
		{"push, one known partition", func(int) error {
			_, err := one.Push(ctx, []queen.Item{{Data: payload}})
			return err
		}},
		{"push, 100 known partitions in turn", func(i int) error {
			_, err := rot.Push(ctx, []queen.Item{{Data: payload, Partition: partName(i % 100)}})
			return err
		}},
		{"push, dedup window 1 min", func(int) error {
			_, err := dedup.Push(ctx, []queen.Item{{Data: payload}})
			return err
		}},
		{"push, dedup window 1 min, 10 items a call", func(i int) error {
			items := make([]queen.Item, 10)
			for j := range items {
				items[j] = queen.Item{Data: payload, Partition: "batch"}
			}
			_, err := dedup.Push(ctx, items)
			return err
		}},
		{"push, keyed (100 keys, 16 lanes)", func(i int) error {
			_, err := keyed.Push(ctx, []queen.Item{{Data: payload, Key: "k" + strconv.Itoa(i%100)}})
			return err
		}},
	}
	for _, k := range kinds {
		for i := range 300 { // warm: every partition known, plans cached
			if err := k.call(i); err != nil {
				return err
			}
		}
		if pss {
			if _, err := stats.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
				return err
			}
		}
		cpu0, err := backendCPU(ctx, stats)
		if err != nil {
			return err
		}
		t := time.Now()
		for i := range *acctN {
			if err := k.call(i); err != nil {
				return err
			}
		}
		el := time.Since(t)
		cpu1, err := backendCPU(ctx, stats)
		if err != nil {
			return err
		}
		n := float64(*acctN)
		fmt.Printf("%s: %d calls, %.0f µs/call wall, backend CPU %.1f µs/call\n", k.name, *acctN,
			float64(el.Microseconds())/n, float64(cpu1-cpu0)/1e3/n)
		if !pss {
			continue
		}
		rows, err := stats.Query(ctx, `SELECT calls, total_exec_time, toplevel, regexp_replace(query, '\s+', ' ', 'g')
			FROM pg_stat_statements WHERE calls >= $1 AND query NOT LIKE '%pg_stat_statements%'
			ORDER BY toplevel DESC, total_exec_time DESC`, *acctN/20)
		if err != nil {
			return err
		}
		for rows.Next() {
			var (
				calls int64
				total float64
				top   bool
				q     string
			)
			if err := rows.Scan(&calls, &total, &top, &q); err != nil {
				rows.Close()
				return err
			}
			lvl := "nested"
			if top {
				lvl = "top"
			}
			q = strings.ReplaceAll(q, `"pushbench".`, "")
			if len(q) > 110 {
				q = q[:110] + "…"
			}
			fmt.Printf("  %6d calls %8.1f µs mean %8.1f µs/call  %-6s %s\n", calls, total*1e3/float64(calls), total*1e3/n, lvl, q)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// backendCPU sums the CPU time, in ns, of the client backends connected to
// the current database (other than stats' own queries, which are few).
func backendCPU(ctx context.Context, stats *pgxpool.Pool) (int64, error) {
	rows, err := stats.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND backend_type = 'client backend'`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var sum int64
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			return 0, err
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			continue // gone, or the server is elsewhere
		}
		f := strings.Fields(string(b))
		if len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			sum += ns
		}
	}
	return sum, rows.Err()
}
