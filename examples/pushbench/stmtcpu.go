package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
)

// stmtCPU splits the isolated push's statement into its parts: on one
// connection with synchronous_commit off (so a commit waits for no flush),
// alternating blocks of 100 calls of each kind, the backend's CPU per call
// (/proc/<pid>/schedstat: the server must run on this machine). The kinds:
// SELECT 1 (a round trip and a statement), the single-row INSERT, the
// AppendSegment statement before it took the partition's id (a lookup by
// name), AppendSegment now, and its two writes alone (no queue row read,
// no check).
// The statement's text is the one a client sends, caught by a tracer (an
// example builds outside the module, so it cannot import internal/stmt).
func stmtCPU(ctx context.Context, url string, payload []byte) error {
	cur, err := appendStatement(ctx, url, "stmtcpu", payload)
	if err != nil {
		return err
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return err
	}
	sch := pgx.Identifier{"pushbench"}.Sanitize()
	var (
		tenant [16]byte
		pid    int64
	)
	if err := c.QueryRow(ctx, "SELECT p.id FROM "+sch+".partitions p JOIN "+sch+".queues q ON q.id = p.queue_id "+
		"WHERE q.name = 'stmtcpu' AND p.name = $1", queen.DefaultPartition).Scan(&pid); err != nil {
		return err
	}
	hashes := make([]byte, 16)
	seg := []any{tenant, "stmtcpu", queen.DefaultPartition, int32(1), hashes, payload, int32(0), int32(0)}
	// The statement as it was, resolving the partition by (queue, name).
	byName := strings.Replace(cur, "    FROM q\n    WHERE p.id = $9::int8 AND p.queue_id = q.id AND p.name = $3::text",
		"    WHERE p.id = (SELECT p2.id FROM "+sch+".partitions p2 JOIN q ON p2.queue_id = q.id\n"+
			"                  WHERE p2.name = $3::text)", 1)
	if byName == cur {
		return fmt.Errorf("stmtcpu: AppendSegment's text changed; update the before form")
	}
	writes := `WITH u AS (
    UPDATE ` + sch + `.partitions p SET
        last_offset   = p.last_offset + $2::int4,
        last_write_at = CASE WHEN clock_timestamp() - p.last_write_at > interval '1 second'
                             THEN clock_timestamp() ELSE p.last_write_at END,
        pending       = true
    WHERE p.id = $1::int8
    RETURNING p.id, p.last_offset, clock_timestamp() AS at
), s AS (
    INSERT INTO ` + sch + `.segments (partition_id, base_offset, end_offset, created_at, blob, failures, hashes)
    SELECT u.id, u.last_offset - $2::int4 + 1, u.last_offset, u.at, $4::bytea, 0, $3::bytea FROM u
)
SELECT 1, 0::int2, u.id, u.last_offset - $2::int4 + 1, u.at, NULL::int4[], NULL::int8[] FROM u`
	if _, err := c.Exec(ctx, "CREATE TABLE IF NOT EXISTS pushbench_rows (id bigserial, data bytea)"); err != nil {
		return err
	}
	kinds := []struct {
		name string
		sql  string
		args []any
	}{
		{"SELECT 1", "SELECT 1", nil},
		{"single-row INSERT", "INSERT INTO pushbench_rows (data) VALUES ($1)", []any{payload}},
		{"AppendSegment, partition by name (before)", byName, seg},
		{"AppendSegment, partition by id (now)", cur, append(slices.Clip(seg), pid)},
		{"its two writes alone (no checks)", writes, []any{pid, int32(1), hashes, payload}},
	}
	bpid := c.PgConn().PID()
	cpu := make([]int64, len(kinds))
	lat := make([][]time.Duration, len(kinds))
	const block = 100
	for r := -1; r*block < *stmtN; r++ { // round -1 unmeasured: plans cached
		for j := range kinds {
			k := (j + max(r, 0)) % len(kinds)
			c0, err := schedNS(bpid)
			if err != nil {
				return err
			}
			for range block {
				t := time.Now()
				rows, err := c.Query(ctx, kinds[k].sql, kinds[k].args...)
				if err != nil {
					return fmt.Errorf("%s: %w", kinds[k].name, err)
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return fmt.Errorf("%s: %w", kinds[k].name, err)
				}
				if r >= 0 {
					lat[k] = append(lat[k], time.Since(t))
				}
			}
			c1, err := schedNS(bpid)
			if err != nil {
				return err
			}
			if r >= 0 {
				cpu[k] += c1 - c0
			}
		}
	}
	fmt.Printf("one connection, synchronous_commit off, %d calls each in alternating blocks of %d:\n", len(lat[0]), block)
	for k, kd := range kinds {
		n := len(lat[k])
		fmt.Printf("  %-44s backend CPU %6.1f µs/call   wall p50 %6s\n", kd.name, float64(cpu[k])/1e3/float64(n),
			pct(lat[k], 50).Round(time.Microsecond))
	}
	return nil
}

// appendStatement is the text of the AppendSegment statement a client
// sends for an isolated push to queue (whose default partition it creates),
// caught by a tracer.
func appendStatement(ctx context.Context, url, queue string, payload []byte) (string, error) {
	tr := &appendTracer{}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return "", err
	}
	pc.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	client, err := queen.Open(ctx, queen.Config{Pool: pool, Schema: "pushbench"})
	if err != nil {
		return "", err
	}
	defer client.Close(ctx)
	q := client.Queue(queue)
	for range 2 { // the first creates the partition, the second is isolated
		if _, err := q.Push(ctx, []queen.Item{{Data: payload}}); err != nil {
			return "", err
		}
	}
	stmt := tr.text()
	if stmt == "" {
		return "", fmt.Errorf("no AppendSegment statement seen")
	}
	return stmt, nil
}

// schedNS is the CPU time, in ns, process pid has run (Linux).
func schedNS(pid uint32) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, fmt.Errorf("stmtcpu needs the server on this machine: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("stmtcpu: empty schedstat")
	}
	return strconv.ParseInt(f[0], 10, 64)
}

// appendTracer keeps the text of the AppendSegment statement a client sent.
type appendTracer struct {
	mu  sync.Mutex
	sql string
}

func (t *appendTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "qq.dedup_window_ms = 0") && strings.Contains(d.SQL, "$9::int8") {
		t.mu.Lock()
		t.sql = d.SQL
		t.mu.Unlock()
	}
	return ctx
}

func (*appendTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *appendTracer) text() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sql
}
