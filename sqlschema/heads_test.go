package sqlschema_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen/internal/pgtest"
)

// retention_step and purge_txns_step trim the head of a partition the same
// way: only the due prefix goes (a due row after a kept one stays), at most
// p_max rows per call, the start marker moves past the last row deleted,
// and the count is returned. A partition someone holds is skipped.
func TestHeadTrimSteps(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	hour := time.Hour.Milliseconds()

	// partition makes a queue with retention of an hour and one partition
	// whose table rows are (base, end, due): due rows are two hours old,
	// the others a second.
	type row struct {
		base, end int64
		due       bool
	}
	partition := func(t *testing.T, table string, rows []row) int64 {
		t.Helper()
		var pid int64
		if err := pool.QueryRow(ctx, `WITH q AS (
    INSERT INTO `+s+`.queues (tenant, name, retention_ms) VALUES (gen_random_uuid(), 'q', $1) RETURNING id)
INSERT INTO `+s+`.partitions (id, queue_id, name, last_offset) SELECT `+s+`.partition_key(id, 'p', 0), id, 'p', $2 FROM q RETURNING id`,
			hour, rows[len(rows)-1].end).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		col := "blob"
		if table == "txns" {
			col = "hashes"
		}
		for _, r := range rows {
			age := time.Second
			if r.due {
				age = 2 * time.Hour
			}
			if _, err := pool.Exec(ctx, "INSERT INTO "+s+"."+table+" (partition_id, base_offset, end_offset, created_at, "+col+
				") VALUES ($1, $2, $3, now() - $4 * interval '1 millisecond', '\\x00')", pid, r.base, r.end, age.Milliseconds()); err != nil {
				t.Fatal(err)
			}
		}
		return pid
	}
	left := func(t *testing.T, table string, pid int64) []int64 {
		t.Helper()
		rows, err := pool.Query(ctx, "SELECT base_offset FROM "+s+"."+table+" WHERE partition_id = $1 ORDER BY 1", pid)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	marker := func(t *testing.T, col string, pid int64) int64 {
		t.Helper()
		var v int64
		if err := pool.QueryRow(ctx, "SELECT "+col+" FROM "+s+".partitions WHERE id = $1", pid).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// Offsets 0-1 and 2-4 due, 5 not, 6-7 due again; the hash sidecar has
	// gaps (a push without a window writes no hash row), so its marker is
	// the end of the last row deleted plus one, not the next row's base.
	segs := []row{{0, 1, true}, {2, 4, true}, {5, 5, false}, {6, 7, true}}
	hashes := []row{{0, 1, true}, {3, 4, true}, {5, 5, false}, {7, 8, true}}

	for _, c := range []struct {
		table, col string
		rows       []row
		step       func(pid int64, max int) string
	}{
		{"segments", "log_start", segs, func(pid int64, max int) string {
			return fmt.Sprintf("SELECT %s.retention_step(%d, %d)", s, pid, max)
		}},
		{"txns", "txns_start", hashes, func(pid int64, max int) string {
			return fmt.Sprintf("SELECT %s.purge_txns_step(%d, %d, %d)", s, pid, hour, max)
		}},
	} {
		t.Run(c.table, func(t *testing.T) {
			pid := partition(t, c.table, c.rows)
			step := func(max int) int {
				t.Helper()
				var n int
				if err := pool.QueryRow(ctx, c.step(pid, max)).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			all := []int64{c.rows[0].base, c.rows[1].base, c.rows[2].base, c.rows[3].base}

			// Held: skipped, nothing deleted.
			holder, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := holder.Exec(ctx, "SELECT 1 FROM "+s+".partitions WHERE id = $1 FOR NO KEY UPDATE", pid); err != nil {
				t.Fatal(err)
			}
			if n := step(10); n != 0 {
				t.Errorf("step on a held partition deleted %d", n)
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if n := step(0); n != 0 {
				t.Errorf("step with max 0 deleted %d", n)
			}
			if got := left(t, c.table, pid); !slices.Equal(got, all) {
				t.Fatalf("rows %v, want all of %v", got, all)
			}

			// max 1: the first due row only.
			if n := step(1); n != 1 {
				t.Errorf("step(1) deleted %d, want 1", n)
			}
			if got := marker(t, c.col, pid); got != c.rows[0].end+1 {
				t.Errorf("%s %d, want %d", c.col, got, c.rows[0].end+1)
			}
			// The rest of the due prefix, not the due row after the kept one.
			if n := step(10); n != 1 {
				t.Errorf("step(10) deleted %d, want 1", n)
			}
			if got := left(t, c.table, pid); !slices.Equal(got, all[2:]) {
				t.Errorf("rows %v, want %v", got, all[2:])
			}
			if got := marker(t, c.col, pid); got != c.rows[1].end+1 {
				t.Errorf("%s %d, want %d", c.col, got, c.rows[1].end+1)
			}
			// Nothing due at the head: nothing deleted, the marker stays.
			if n := step(10); n != 0 {
				t.Errorf("step with a kept head deleted %d", n)
			}
			if got := marker(t, c.col, pid); got != c.rows[1].end+1 {
				t.Errorf("%s moved to %d with nothing deleted", c.col, got)
			}
		})
	}

	// A keep of 0 or less keeps no hash row at all: everything written
	// before the call is older than it.
	for _, keep := range []int64{0, -hour} {
		t.Run(fmt.Sprintf("txns keep %d", keep), func(t *testing.T) {
			pid := partition(t, "txns", hashes)
			var n int
			if err := pool.QueryRow(ctx, "SELECT "+s+".purge_txns_step($1, $2, 10)", pid, keep).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != len(hashes) {
				t.Errorf("deleted %d, want all %d", n, len(hashes))
			}
			if got := marker(t, "txns_start", pid); got != hashes[3].end+1 {
				t.Errorf("txns_start %d, want %d", got, hashes[3].end+1)
			}
		})
	}
}

// head_trim reads each table through its primary key as a range from the
// partition's head, in the generic plan PL/pgSQL caches (the other table's
// branch skipped by a one-time filter) as in a custom plan: one trim for
// both tables reads no more than a query per table. Nothing is sorted or
// read by a sequential scan.
func TestHeadTrimPlan(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	// A few partitions with a backlog each, analyzed, as a live schema.
	if _, err := pool.Exec(ctx, `WITH q AS (
    INSERT INTO `+s+`.queues (tenant, name, retention_ms) VALUES (gen_random_uuid(), 'q', 1) RETURNING id)
INSERT INTO `+s+`.partitions (id, queue_id, name, last_offset) SELECT `+s+`.partition_key(id, 'p' || g, 0), id, 'p' || g, 999 FROM q, generate_series(1, 20) g`); err != nil {
		t.Fatal(err)
	}
	for _, ins := range []string{
		"INSERT INTO " + s + ".segments (partition_id, base_offset, end_offset, created_at, blob)" +
			" SELECT p.id, o, o, now() - interval '1 hour', '\\x00' FROM " + s + ".partitions p, generate_series(0, 999) o",
		"INSERT INTO " + s + ".txns (partition_id, base_offset, end_offset, created_at, hashes)" +
			" SELECT p.id, o, o, now() - interval '1 hour', '\\x00' FROM " + s + ".partitions p, generate_series(0, 999) o",
		"ANALYZE " + s + ".segments", "ANALYZE " + s + ".txns", "ANALYZE " + s + ".partitions",
	} {
		if _, err := pool.Exec(ctx, ins); err != nil {
			t.Fatal(err)
		}
	}
	var pids []int64
	rows, err := pool.Query(ctx, "SELECT id FROM "+s+".partitions ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	if pids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	var plans []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { plans = append(plans, n.Message) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LOAD 'auto_explain'"); err != nil {
		t.Skipf("auto_explain cannot be loaded: %v", err)
	}
	for _, set := range []string{
		"SET auto_explain.log_min_duration = 0", "SET auto_explain.log_nested_statements = on",
		"SET auto_explain.log_analyze = on", "SET auto_explain.log_timing = off",
		"SET auto_explain.log_level = notice",
	} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	scan := regexp.MustCompile(` on (segments|txns)\b`)
	for i, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			call, table string
			statements  int
		}{
			// The cut, the copy of the hashes still owed, the delete.
			{fmt.Sprintf("SELECT %s.retention_step(%d, 4)", s, pids[i]), "segments", 3},
			// The cut and the delete.
			{fmt.Sprintf("SELECT %s.purge_txns_step(%d, 1, 4)", s, pids[i]), "txns", 2},
		} {
			plans = plans[:0]
			var n int
			if err := conn.QueryRow(ctx, c.call).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 4 {
				t.Fatalf("%s: %s deleted %d, want 4", mode, c.call, n)
			}
			touched := 0
			for _, p := range plans {
				if !scan.MatchString(p) {
					continue // the partition lock, the call itself
				}
				touched++
				// A sort would mean the cut read the whole partition.
				for _, bad := range []string{"Seq Scan", "Sort Method"} {
					if strings.Contains(p, bad) {
						t.Errorf("%s: %s: plan has a %s:\n%s", mode, c.call, bad, p)
					}
				}
				if !strings.Contains(p, c.table+"_pkey") {
					t.Errorf("%s: %s: plan does not read %s through its primary key:\n%s", mode, c.call, c.table, p)
				}
				for _, line := range strings.Split(p, "\n") {
					if m := scan.FindStringSubmatch(line); m != nil && m[1] != c.table && !strings.Contains(line, "(never executed)") &&
						!strings.Contains(line, "Insert on txns") {
						t.Errorf("%s: %s reads %s:\n%s", mode, c.call, m[1], p)
					}
				}
			}
			if touched != c.statements {
				t.Errorf("%s: %s: %d statements read %s, want %d:\n%s", mode, c.call, touched, c.table, c.statements,
					strings.Join(plans, "\n"))
			}
		}
	}
}
