package stmt_test

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

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

// The functions answer the codes the tables name, on a real database: the
// push verdicts that need no stored message and the settle verdicts of a
// cursor in each state.
func TestStatusCodesFromFunctions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
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
			"INSERT INTO "+tbl("partitions")+" (queue_id, name) SELECT id, 'p' FROM q RETURNING id", tenant, q.name, q.enc).Scan(q.out); err != nil {
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
			[]int32{0}, [][]byte{nil}, []time.Time{time.Now()}, []string{""}, [][]byte{nil}, [][]byte{nil}).Scan(&ord, &st, &committed); err != nil {
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
