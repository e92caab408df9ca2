package stmt_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/alloc"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/internal/stmt"
	"github.com/e03140bc/queen/sqlschema"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// The codes Go gives names to, by the name the SQL documents them under.
var goCodes = map[string]map[string]int16{
	"push status": {
		"queued":              int16(alloc.Queued),
		"duplicate":           int16(alloc.Duplicate),
		"encryption_required": int16(alloc.EncryptionRequired),
		"lanes_changed":       int16(alloc.LanesChanged),
		"needs_bundle":        int16(alloc.NeedsBundle),
	},
	"settle status": {
		"applied":       stmt.SettleApplied,
		"below_cursor":  stmt.SettleBelowCursor,
		"lease_lost":    stmt.SettleLeaseLost,
		"dead_lettered": stmt.SettleDeadLettered,
		"dropped":       stmt.SettleDropped,
		"unknown":       stmt.SettleUnknown,
		"requeued":      stmt.SettleRequeued,
	},
	"settle action": {
		"none":        stmt.ActNone,
		"fail":        stmt.ActFail,
		"retry":       stmt.ActRetry,
		"dead_letter": stmt.ActDeadLetter,
		"interrupt":   stmt.ActInterrupt,
		"carry":       stmt.ActCarry,
		"park":        stmt.ActPark,
		"held":        stmt.ActHeld,
	},
}

var codeRE = regexp.MustCompile(`(?m)^--   (push status|settle status|settle action) (\d+) ([a-z_]+):`)

// The status codes and actions documented in the function layer are
// exactly the Go constants: same names, same numbers, none missing on
// either side.
func TestStatusCodesMatchSQL(t *testing.T) {
	sqlCodes := map[string]map[string]int16{}
	for _, f := range sqlschema.FunctionFiles() {
		for _, m := range codeRE.FindAllStringSubmatch(f.SQL("s"), -1) {
			n, err := strconv.ParseInt(m[2], 10, 16)
			if err != nil {
				t.Fatal(err)
			}
			if sqlCodes[m[1]] == nil {
				sqlCodes[m[1]] = map[string]int16{}
			}
			if _, dup := sqlCodes[m[1]][m[3]]; dup {
				t.Errorf("functions/%s: %s %s documented twice", f.Name, m[1], m[3])
			}
			sqlCodes[m[1]][m[3]] = int16(n)
		}
	}
	for kind, want := range goCodes {
		got := sqlCodes[kind]
		byCode := map[int16]string{}
		for name, code := range got {
			if other, dup := byCode[code]; dup {
				t.Errorf("%s %d is both %s and %s in SQL", kind, code, other, name)
			}
			byCode[code] = name
			if g, ok := want[name]; !ok {
				t.Errorf("SQL documents %s %d %s; Go has no constant for it", kind, code, name)
			} else if g != code {
				t.Errorf("%s %s: Go %d, SQL %d", kind, name, g, code)
			}
		}
		for name, code := range want {
			if _, ok := got[name]; !ok {
				t.Errorf("Go has %s %s = %d; the SQL does not document it", kind, name, code)
			}
		}
	}
}

// migrated returns a context bounded by the test and a minute, the shared
// pool, and a fresh schema with every migration and function applied.
func migrated(t *testing.T) (context.Context, *pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pool, schema := pgtest.Migrated(t)
	return ctx, pool, schema
}

// The functions answer the codes the tables name, on a real database: the
// push verdicts that need no stored message and the settle verdicts of a
// cursor in each state.
func TestStatusCodesFromFunctions(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s, c := stmt.New(schema), stmt.NewConsume(schema)
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	var tenant uuid.UUID
	var pid, encPid int64
	for _, q := range []struct {
		name string
		enc  bool
		out  *int64
	}{{"plain", false, &pid}, {"enc", true, &encPid}} {
		if err := pool.QueryRow(ctx, "WITH q AS (INSERT INTO "+tbl("queues")+" (tenant, name, encryption, lanes) VALUES ($1, $2, $3, 4) RETURNING id) "+
			"INSERT INTO "+tbl("partitions")+" (id, queue_id, name) SELECT "+tbl("partition_key")+"(id, 'p', 0), id, 'p' FROM q RETURNING id", tenant, q.name, q.enc).Scan(q.out); err != nil {
			t.Fatal(err)
		}
	}
	push := func(queue, part string, flags, lanes int32) int16 {
		t.Helper()
		var ord int32
		var st int16
		var rest [5]any
		if err := pool.QueryRow(ctx, s.PushSegment, tenant, queue, part, 1, make([]byte, 16), []byte{0}, flags, lanes).
			Scan(&ord, &st, &rest[0], &rest[1], &rest[2], &rest[3], &rest[4]); err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, tc := range []struct {
		name string
		got  int16
		want alloc.Status
	}{
		{"no such partition", push("plain", "missing", 0, 0), alloc.NeedsBundle},
		{"plaintext to an encrypted queue", push("enc", "p", 0, 0), alloc.EncryptionRequired},
		{"routed with another lane count", push("plain", "p", 0, 8), alloc.LanesChanged},
	} {
		if tc.got != int16(tc.want) {
			t.Errorf("push, %s: status %d, want %d", tc.name, tc.got, tc.want)
		}
	}

	lease := uuid.Must(uuid.NewV4())
	if _, err := pool.Exec(ctx, "INSERT INTO "+tbl("consumers")+" (partition_id, group_name, committed, batch_end, lease_id, lease_owner, lease_expires_at) "+
		"VALUES ($1, 'live', 2, 9, $2, 'test', now() + interval '1 hour'), ($1, 'idle', 2, NULL, NULL, NULL, NULL)", pid, lease); err != nil {
		t.Fatal(err)
	}
	settle := func(pid int64, group string, lease uuid.UUID, ok int64) int16 {
		t.Helper()
		var ord int32
		var st int16
		var committed *int64
		if err := pool.QueryRow(ctx, c.Settle, []int64{pid}, []string{group}, []uuid.UUID{lease}, []int64{ok},
			[]int16{stmt.ActNone}, []int64{-1}, []bool{false}, []string{""}, []uuid.UUID{uuid.Nil}, []string{""},
			[]int32{0}, [][]byte{nil}, []time.Time{time.Now()}, []string{""}, [][]byte{nil}, [][]byte{nil}, []int64{0}).Scan(&ord, &st, &committed); err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, tc := range []struct {
		name      string
		got, want int16
	}{
		{"no such cursor", settle(pid, "nobody", lease, 3), stmt.SettleUnknown},
		{"at or below the cursor", settle(pid, "live", lease, 2), stmt.SettleBelowCursor},
		{"without the cursor's lease", settle(pid, "idle", lease, 3), stmt.SettleLeaseLost},
		{"under the live lease", settle(pid, "live", lease, 3), stmt.SettleApplied},
	} {
		if tc.got != tc.want {
			t.Errorf("settle, %s: status %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}

// AppendSegment writes exactly when PushSegment would queue the segment
// without probing a dedup window, and otherwise writes nothing and answers
// no row (the caller then sends it with PushBundle). Where it writes, it
// leaves the rows PushSegment leaves.
func TestAppendSegmentAppliesWherePushSegmentQueues(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := stmt.New(schema)
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	tenant := uuid.Must(uuid.NewV4())
	for _, q := range []struct {
		name  string
		enc   bool
		keyed bool
		win   int64
	}{{"plain", false, false, 0}, {"enc", true, false, 0}, {"keyed", false, true, 0}, {"dedup", false, false, 60000}} {
		if _, err := pool.Exec(ctx, "WITH q AS (INSERT INTO "+tbl("queues")+" (tenant, name, encryption, lanes, keyed, dedup_window_ms) VALUES ($1, $2, $3, 4, $4, $5) RETURNING id) "+
			"INSERT INTO "+tbl("partitions")+" (id, queue_id, name) SELECT "+tbl("partition_key")+"(id, p, 0), id, p FROM q, unnest(ARRAY['a', 'b']) AS p", tenant, q.name, q.enc, q.keyed, q.win); err != nil {
			t.Fatal(err)
		}
	}
	type state struct {
		last   int64
		segs   int
		hashed int // segments whose hashes are stored: in their row, or in a hash row
	}
	read := func(queue, part string) state {
		t.Helper()
		var st state
		if err := pool.QueryRow(ctx, "SELECT p.last_offset, (SELECT count(*) FROM "+tbl("segments")+" s WHERE s.partition_id = p.id), "+
			"(SELECT count(*) FROM "+tbl("segments")+" s WHERE s.partition_id = p.id AND octet_length(s.hashes) = 16 * (s.end_offset - s.base_offset + 1)) + "+
			"(SELECT count(*) FROM "+tbl("txns")+" x WHERE x.partition_id = p.id) FROM "+tbl("partitions")+" p JOIN "+tbl("queues")+
			" q ON q.id = p.queue_id WHERE q.tenant = $1 AND q.name = $2 AND p.name = $3", tenant, queue, part).Scan(&st.last, &st.segs, &st.hashed); err != nil {
			t.Fatal(err)
		}
		return st
	}
	type in struct {
		tenant       uuid.UUID
		queue, part  string
		count        int32
		hashes       []byte
		flags, lanes int32
		// id names the partition's row: "" its own (derived) id, else
		// "queue/partition" another's, or "none" an id no row has.
		id string
	}
	idOf := func(x in) int64 {
		t.Helper()
		queue, part := x.queue, x.part
		switch {
		case x.id == "none":
			return 12345
		case x.id != "":
			queue, part, _ = strings.Cut(x.id, "/")
		}
		var id int64
		if err := pool.QueryRow(ctx, "SELECT coalesce((SELECT "+tbl("partition_key")+"(q.id, $3, 0) FROM "+tbl("queues")+
			" q WHERE q.tenant = $1 AND q.name = $2), 0)", x.tenant, queue, part).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	hashes := func(n int) []byte { return make([]byte, n) }
	appendSeg := func(x in) (rows int, status int16, base int64) {
		t.Helper()
		r, err := pool.Query(ctx, s.AppendSegment, x.tenant, x.queue, x.part, x.count, x.hashes, []byte{0, 'x'}, x.flags, x.lanes, idOf(x))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for r.Next() {
			var ord int32
			var pid, b *int64
			var at *time.Time
			var di, do any
			if err := r.Scan(&ord, &status, &pid, &b, &at, &di, &do); err != nil {
				t.Fatal(err)
			}
			if ord != 1 || pid == nil || b == nil || at == nil {
				t.Fatalf("AppendSegment row: ord %d, partition %v, base %v, created %v", ord, pid, b, at)
			}
			rows, base = rows+1, *b
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		return rows, status, base
	}
	pushSeg := func(x in) (int16, error) {
		var ord int32
		var st int16
		var rest [5]any
		err := pool.QueryRow(ctx, s.PushSegment, x.tenant, x.queue, x.part, x.count, x.hashes, []byte{0, 'x'}, x.flags, x.lanes).
			Scan(&ord, &st, &rest[0], &rest[1], &rest[2], &rest[3], &rest[4])
		return st, err
	}
	for _, tc := range []struct {
		name  string
		x     in
		apply bool
	}{
		{"plain", in{tenant, "plain", "a", 2, hashes(32), 0, 0, ""}, true},
		{"routed with the queue's lane count", in{tenant, "plain", "a", 1, hashes(16), 0, 4, ""}, true},
		{"encrypted segment to an encrypted queue", in{tenant, "enc", "a", 1, hashes(16), 1, 0, ""}, true},
		{"keyed segment to a keyed queue", in{tenant, "keyed", "a", 1, hashes(16), 2, 4, ""}, true},
		{"no such partition", in{tenant, "plain", "missing", 1, hashes(16), 0, 0, ""}, false},
		{"no such queue", in{tenant, "missing", "a", 1, hashes(16), 0, 0, ""}, false},
		{"another tenant", in{uuid.Must(uuid.NewV4()), "plain", "a", 1, hashes(16), 0, 0, ""}, false},
		{"another partition's id", in{tenant, "plain", "a", 1, hashes(16), 0, 0, "plain/b"}, false},
		{"another queue's partition's id", in{tenant, "plain", "a", 1, hashes(16), 0, 0, "enc/a"}, false},
		{"an id no partition has", in{tenant, "plain", "a", 1, hashes(16), 0, 0, "none"}, false},
		{"plaintext to an encrypted queue", in{tenant, "enc", "b", 1, hashes(16), 0, 0, ""}, false},
		{"routed with another lane count", in{tenant, "plain", "b", 1, hashes(16), 0, 8, ""}, false},
		{"the queue's first keyed segment", in{tenant, "plain", "b", 1, hashes(16), 2, 4, ""}, false},
		{"a queue with a dedup window", in{tenant, "dedup", "a", 1, hashes(16), 0, 0, ""}, false},
		{"hashes not 16 bytes a message", in{tenant, "plain", "b", 2, hashes(31), 0, 0, ""}, false},
		{"no message", in{tenant, "plain", "b", 0, hashes(0), 0, 0, ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := tc.x
			var before state
			if x.tenant == tenant && x.queue != "missing" && x.part != "missing" {
				before = read(x.queue, x.part)
			}
			var otherBefore state
			oq, op, other := strings.Cut(x.id, "/")
			if other {
				otherBefore = read(oq, op)
			}
			rows, status, base := appendSeg(x)
			if !tc.apply {
				if rows != 0 {
					t.Fatalf("AppendSegment answered %d rows, want none", rows)
				}
				if before != (state{}) {
					if after := read(x.queue, x.part); after != before {
						t.Fatalf("AppendSegment wrote without applying: %+v, then %+v", before, after)
					}
				}
				if other {
					if after := read(oq, op); after != otherBefore {
						t.Fatalf("AppendSegment wrote to the partition whose id it was given: %+v, then %+v", otherBefore, after)
					}
				}
				if x.id != "" {
					return // PushSegment finds the partition by name
				}
				// PushSegment does not queue it either without probing a
				// dedup window (the one case AppendSegment leaves to it).
				if st, err := pushSeg(x); err == nil && alloc.Status(st) == alloc.Queued && x.queue != "dedup" {
					t.Fatalf("PushSegment queued what AppendSegment refused")
				}
				return
			}
			if rows != 1 || status != int16(alloc.Queued) {
				t.Fatalf("AppendSegment: %d rows, status %d; want one, queued", rows, status)
			}
			mid := read(x.queue, x.part)
			if want := (state{before.last + int64(x.count), before.segs + 1, before.hashed + 1}); mid != want || base != before.last+1 {
				t.Fatalf("after AppendSegment: %+v, base %d; want %+v, base %d", mid, base, want, before.last+1)
			}
			// PushSegment on the same input, right after, writes the same.
			if st, err := pushSeg(x); err != nil || alloc.Status(st) != alloc.Queued {
				t.Fatalf("PushSegment on the same input: status %d, %v", st, err)
			}
			if after, want := read(x.queue, x.part), (state{mid.last + int64(x.count), mid.segs + 1, mid.hashed + 1}); after != want {
				t.Fatalf("after PushSegment: %+v, want %+v", after, want)
			}
		})
	}
}

// ScanRow (scanPrefix) fills the prefix of dest a statement has columns for (a previous
// release's statement returns fewer), scans only the columns dest names,
// and says when there is no row.
func TestScanRow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	a, b, c := 0, "", true
	if err := stmt.ScanRow(ctx, pool, "SELECT $1::int, 'two'", []any{1}, &a, &b, &c); err != nil || a != 1 || b != "two" || !c {
		t.Fatalf("two columns into three: %d %q %v, %v", a, b, c, err)
	}
	if err := stmt.ScanRow(ctx, pool, "SELECT 3, 'x', false", nil, &a, &b, &c); err != nil || a != 3 || b != "x" || c {
		t.Fatalf("three columns into three: %d %q %v, %v", a, b, c, err)
	}
	if err := stmt.ScanRow(ctx, pool, "SELECT 4, 'y', true", nil, &a); err != nil || a != 4 || b != "x" || c {
		t.Fatalf("three columns into one: %d %q %v, %v", a, b, c, err)
	}
	if err := stmt.ScanRow(ctx, pool, "SELECT 1 WHERE false", nil, &a); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("no row: %v", err)
	}
	if err := stmt.ScanRow(ctx, pool, "SELECT 1/0", nil, &a); err == nil {
		t.Fatal("a failing statement gave no error")
	}
}
