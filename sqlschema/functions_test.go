package sqlschema_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/sqlschema"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Each revision of the function layer has one hash, pinned in
// testdata/functions.sum: editing functions/*.sql without bumping
// FunctionsRevision (and appending the new line) fails here.
func TestFunctionsRevisionPinned(t *testing.T) {
	f, err := os.Open("testdata/functions.sum")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]int{}
	rev := 0
	var last string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		r, h, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(r)
		if !ok || err != nil || n != rev+1 || len(h) != 64 {
			t.Fatalf("functions.sum line %q: want %d <sha256 hex>", sc.Text(), rev+1)
		}
		if prev, dup := seen[h]; dup {
			t.Fatalf("revisions %d and %d have the same hash", prev, n)
		}
		seen[h], rev, last = n, n, h
	}
	if rev != sqlschema.FunctionsRevision || last != sqlschema.FunctionsHash() {
		t.Fatalf("functions/*.sql hash %s at revision %d; functions.sum ends with revision %d %s.\n"+
			"After editing functions/*.sql, bump FunctionsRevision and append %q",
			sqlschema.FunctionsHash(), sqlschema.FunctionsRevision, rev, last,
			fmt.Sprintf("%d %s", sqlschema.FunctionsRevision+1, sqlschema.FunctionsHash()))
	}
}

var createRE = regexp.MustCompile(`(?m)^CREATE OR REPLACE (FUNCTION|VIEW) "s"\.([a-z_0-9]+)`)

// Every function and view of a migrated schema is defined in the function
// layer, and the layer defines nothing else (no table, no type).
func TestFunctionLayerCoversSchema(t *testing.T) {
	ctx := ctxT(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, f := range sqlschema.FunctionFiles() {
		tmpl := f.SQL("s")
		for _, m := range createRE.FindAllStringSubmatch(tmpl, -1) {
			defined[m[2]] = true
		}
		for _, l := range strings.Split(tmpl, "\n") {
			if u := strings.ToUpper(l); strings.HasPrefix(u, "CREATE ") && !strings.HasPrefix(u, "CREATE OR REPLACE FUNCTION ") &&
				!strings.HasPrefix(u, "CREATE OR REPLACE VIEW ") {
				t.Errorf("functions/%s: %q belongs in a migration", f.Name, l)
			}
		}
	}
	rows, err := pool.Query(ctx, `SELECT p.proname FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
UNION SELECT c.relname FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'v'`, schema)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 20 {
		t.Fatalf("only %d functions and views in the schema: %v", len(names), names)
	}
	for _, n := range names {
		if !defined[n] {
			t.Errorf("%s is in the schema but in no functions/*.sql", n)
		}
		delete(defined, n)
	}
	for n := range defined {
		t.Errorf("functions/*.sql defines %s, which the schema does not hold", n)
	}
}

// functionDefs is every function's and view's definition in schema, by
// signature, as PostgreSQL prints it.
func functionDefs(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) map[string]string {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p
WHERE p.pronamespace = $1::regnamespace
UNION ALL SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'v'`, schema)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var sig, def string
		if err := rows.Scan(&sig, &def); err != nil {
			t.Fatal(err)
		}
		out[strings.ReplaceAll(sig, schema, "S")] = strings.ReplaceAll(def, schema, "S")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// changedSinceV5 lists, by signature (views by name), what the unreleased
// revision 1 of the function layer deliberately defines differently from
// the version-5 database (or anew), with why. Everything else must match
// version 5 exactly; every entry here must really differ, so the list
// cannot go stale.
var changedSinceV5 = map[string]string{
	// Listing and requeueing dead letters select through one function.
	"S.dead_letters_page(uuid,text,text[],text,timestamp with time zone,timestamp with time zone,bigint,integer,bigint[])": "new: a DeadLetterQuery's page",
	// The previous release's settle and settle_keyed build their
	// failures' segments through one helper.
	"S.raw_segments(smallint[],uuid[],integer[],text[],bytea[],text[],bytea[])": "new: the previous release's re-enqueue segments",
	// Lag has one definition, shared with Queue.Status and Queues, which
	// counted what Retention deleted unread as lag and the view did not.
	"S.lag_messages(bigint,bigint,bigint)": "new: the one definition of lag in messages",
	"S.lag_head(bigint,bigint,bigint)":     "new: the one definition of the oldest unread message's segment",
	"consumer_lag":                         "reads lag_messages, and lag_head spelled out as joins (Citus runs them)",
	// What releasing a lease clears is said once, in lease_after.
	"S.lease_after(boolean,bigint,uuid,text,timestamp with time zone)": "new: the lease columns after a settle",
	"S.ack_many(bigint[],text[],uuid[],bigint[])":                      "releases the lease through lease_after",
	// The re-enqueue's frame is built in Go and passed as a segment: the
	// previous release's entry points wrap their successors and build it
	// in SQL for that release's callers only.
	"S.settle(bigint[],text[],uuid[],bigint[],smallint[],bigint[],boolean[],text[],uuid[],text[],integer[],bytea[]," +
		"timestamp with time zone[],text[],bytea[])": "the previous release's: builds failures' segments, calls settle_v2",
	"S.settle_keyed(bigint[],text[],uuid[],bigint[],smallint[],boolean[],text[],uuid[],text[],integer[],bytea[]," +
		"timestamp with time zone[],text[],bytea[])": "the previous release's: builds failures' segments, calls settle_keyed_v2",
	"S.requeue_dead_letters(bigint,bigint[],bytea[],bytea[],integer[])":       "the previous release's: builds the segments, calls requeue_dead_letters_v2",
	"S.requeue_one(bigint,bigint,uuid,integer,text,bytea,integer,text,bytea)": "builds the segment, calls requeue_one with it",
	"S.settle_v2(bigint[],text[],uuid[],bigint[],smallint[],bigint[],boolean[],text[],uuid[],text[],integer[],bytea[]," +
		"timestamp with time zone[],text[],bytea[],bytea[])": "new: settle with the client-built re-enqueue segments; lease_after, lock_requeue_partitions",
	"S.settle_keyed_v2(bigint[],text[],uuid[],bigint[],smallint[],boolean[],text[],uuid[],text[],integer[],bytea[]," +
		"timestamp with time zone[],text[],bytea[],bytea[])": "new: settle_keyed with the client-built re-enqueue segments; lease_after, lock_requeue_partitions",
	"S.requeue_dead_letters_v2(bigint,bigint[],bytea[],bytea[],integer[],bytea[])": "new: requeue_dead_letters with the client-built segments",
	"S.requeue_one(bigint,bigint,bytea,integer)":                                   "new: appends a client-built segment",
	"S.pop_dead_letter(bigint,text,uuid,bigint,bigint[],uuid[],text[],integer[],bytea[],timestamp with time zone[]," +
		"text[],text[],bytea[])": "releases the lease through lease_after",
	// The partitions a skip-policy failure may append to are chosen and
	// locked in one helper (settle waited or skipped, settle_keyed waited).
	"S.lock_requeue_partitions(bigint[],smallint[],boolean)": "new: settle's and settle_keyed's partition locks",
	// Whether retention is due is decided once, for head_trim and the
	// maintenance pass's MaintenanceDue statement.
	"S.retention_due(timestamp with time zone,bigint,bigint,bigint,timestamp with time zone,boolean,bigint," +
		"timestamp with time zone)": "new: the retention rule per segment",
	// The head of a partition's segments and of its hash sidecar is
	// trimmed by one rule, in head_trim.
	"S.head_trim(bigint,boolean,integer,bigint,bigint,timestamp with time zone,boolean,bigint," +
		"timestamp with time zone)": "new: the due prefix of segments or hash rows, deleted, and the start marker moved",
	"S.retention_step(bigint,integer)":         "decides through retention_due; trims through head_trim",
	"S.purge_txns_step(bigint,bigint,integer)": "trims through head_trim",
	// An isolated push is stamped once it holds its partition row.
	"S.push_one(bigint,integer,bytea,bigint,bytea,bigint,timestamp with time zone,integer)": "p_now NULL: stamped after the row lock",
	"S.push_segment(uuid,text,text,integer,bytea,bytea,integer,integer)":                    "lets push_one stamp after the row lock",
}

// Revision 1 of the function layer is the functions as migrations 001-005
// defined them before they moved to the layer: a database of schema
// version 5 (the v5 fixture, dumped from one) has the same definitions as
// a schema the current Migrate creates, but for changedSinceV5.
func TestFunctionLayerRevision1MatchesVersion5(t *testing.T) {
	if sqlschema.FunctionsRevision != 1 {
		t.Skip("the function layer has moved on from the version-5 definitions")
	}
	ctx := ctxT(t)
	pool := pgtest.Pool(t)
	v5, layered := pgtest.Schema(t), pgtest.Schema(t)
	body, err := os.ReadFile("testdata/v5.sql")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	// The dump empties search_path: a connection of its own.
	defer conn.Close(context.Background())
	if _, err := conn.PgConn().Exec(ctx, strings.ReplaceAll(string(body), "{{schema_name}}", v5)).ReadAll(); err != nil {
		t.Fatalf("load the v5 fixture: %v", err)
	}
	if _, err := sqlschema.Migrate(ctx, pool, layered); err != nil {
		t.Fatal(err)
	}
	want, got := functionDefs(t, ctx, pool, v5), functionDefs(t, ctx, pool, layered)
	for sig, def := range want {
		if _, changed := changedSinceV5[sig]; changed {
			continue
		}
		if g, ok := got[sig]; !ok {
			t.Errorf("%s is in the version-5 database, not in the function layer", sig)
		} else if g != def {
			t.Errorf("%s differs:\nversion 5:\n%s\nfunction layer:\n%s", sig, def, g)
		}
	}
	for sig := range got {
		if _, ok := want[sig]; !ok {
			if _, listed := changedSinceV5[sig]; !listed {
				t.Errorf("%s is new in the function layer but not listed in changedSinceV5", sig)
			}
		}
	}
	for sig := range changedSinceV5 {
		if g, ok := got[sig]; !ok {
			t.Errorf("changedSinceV5 lists %s, which the function layer does not define", sig)
		} else if g == want[sig] {
			t.Errorf("changedSinceV5 lists %s, which is as version 5 defined it", sig)
		}
	}
}

func functionsRow(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) (sqlschema.FunctionsState, time.Time) {
	t.Helper()
	var s sqlschema.FunctionsState
	var at time.Time
	if err := pool.QueryRow(ctx, "SELECT version, revision, hash, applied_at FROM "+
		pgx.Identifier{schema, "schema_functions"}.Sanitize()).Scan(&s.Version, &s.Revision, &s.Hash, &at); err != nil {
		t.Fatal(err)
	}
	return s, at
}

// markFunction gives uvarint a body that tells whether the function layer
// was applied over it since.
func markFunction(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) {
	t.Helper()
	if _, err := pool.Exec(ctx, "CREATE OR REPLACE FUNCTION "+pgx.Identifier{schema, "uvarint"}.Sanitize()+
		"(p_n bigint) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$ SELECT '\\x6d61726b'::bytea $$"); err != nil {
		t.Fatal(err)
	}
}

func marked(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) bool {
	t.Helper()
	var b []byte
	if err := pool.QueryRow(ctx, "SELECT "+pgx.Identifier{schema, "uvarint"}.Sanitize()+"(300)").Scan(&b); err != nil {
		t.Fatal(err)
	}
	return string(b) == "mark"
}

// Migrate records the function layer it applied, applies it again only
// when the recorded one is older or differs, and repairs it then.
func TestMigrateAppliesFunctionLayer(t *testing.T) {
	ctx := ctxT(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	s, at := functionsRow(t, ctx, pool, schema)
	want := sqlschema.FunctionsState{Version: sqlschema.Latest(), Revision: sqlschema.FunctionsRevision, Hash: sqlschema.FunctionsHash()}
	if s != want {
		t.Fatalf("recorded %+v, want %+v", s, want)
	}
	if got, ok, err := sqlschema.Functions(ctx, pool, schema); err != nil || !ok || got != want {
		t.Fatalf("Functions = %+v %v %v", got, ok, err)
	}
	// Up to date: nothing is applied, so a hand edit stays.
	markFunction(t, ctx, pool, schema)
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if _, at2 := functionsRow(t, ctx, pool, schema); !at2.Equal(at) || !marked(t, ctx, pool, schema) {
		t.Fatal("an up-to-date function layer was applied again")
	}
	// An older revision, or the same one with other text: applied again.
	for _, set := range []string{"revision = revision - 1", "hash = 'other'"} {
		if _, err := pool.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "schema_functions"}.Sanitize()+" SET "+set); err != nil {
			t.Fatal(err)
		}
		markFunction(t, ctx, pool, schema)
		if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
			t.Fatal(err)
		}
		if s, _ := functionsRow(t, ctx, pool, schema); s != want || marked(t, ctx, pool, schema) {
			t.Fatalf("after %s: recorded %+v, marked %v; want the layer applied", set, s, marked(t, ctx, pool, schema))
		}
	}
}

// A function layer of a newer revision stays: this binary's statements
// still find their functions under the names they know.
func TestMigrateKeepsNewerFunctionLayer(t *testing.T) {
	ctx := ctxT(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "schema_functions"}.Sanitize()+
		" SET revision = revision + 1, hash = 'newer'"); err != nil {
		t.Fatal(err)
	}
	markFunction(t, ctx, pool, schema)
	before, at := functionsRow(t, ctx, pool, schema)
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if after, at2 := functionsRow(t, ctx, pool, schema); after != before || !at2.Equal(at) || !marked(t, ctx, pool, schema) {
		t.Fatalf("a newer function layer was overwritten: %+v -> %+v", before, after)
	}
}

// A function layer applied by a binary with newer migrations stops Migrate
// with ErrSchemaTooNew before it touches anything.
func TestMigrateFunctionLayerFromNewerVersion(t *testing.T) {
	ctx := ctxT(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	// Revision 0 and another hash: this binary would apply its layer if
	// the version did not stop it.
	if _, err := pool.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "schema_functions"}.Sanitize()+
		" SET version = version + 1, revision = 0, hash = 'from the future'"); err != nil {
		t.Fatal(err)
	}
	markFunction(t, ctx, pool, schema)
	before, at := functionsRow(t, ctx, pool, schema)
	_, err := sqlschema.Migrate(ctx, pool, schema)
	if !errors.Is(err, sqlschema.ErrSchemaTooNew) {
		t.Fatalf("Migrate: %v, want ErrSchemaTooNew", err)
	}
	if after, at2 := functionsRow(t, ctx, pool, schema); after != before || !at2.Equal(at) || !marked(t, ctx, pool, schema) {
		t.Fatalf("functions touched: %+v -> %+v", before, after)
	}
}

// Migrations hold stored state only: functions and views belong to the
// function layer, where they can change without a new version.
func TestMigrationsHoldNoFunctions(t *testing.T) {
	re := regexp.MustCompile(`(?i)\bCREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|VIEW|TRIGGER)\b`)
	for _, m := range sqlschema.Migrations() {
		if loc := re.FindStringIndex(m.SQL("s")); loc != nil {
			t.Errorf("migration %d (%s) creates %q: put it in functions/*.sql", m.Version, m.Name, m.SQL("s")[loc[0]:loc[1]])
		}
	}
}

// The frame encoder in SQL serves the previous release's entry points
// only: no other function file calls it (the client builds frames).
func TestFramesEncodedInSQLOnlyForThePreviousRelease(t *testing.T) {
	seen := false
	for _, f := range sqlschema.FunctionFiles() {
		body := f.SQL("s")
		for _, fn := range []string{"raw_segment(", "uvarint("} {
			n := strings.Count(body, `"s".`+fn)
			if f.Name == "previous.sql" {
				seen = seen || n > 0
			} else if n > 0 {
				t.Errorf("functions/%s calls %s)", f.Name, fn)
			}
		}
	}
	if !seen {
		t.Fatal("previous.sql defines no frame encoder: this test checks nothing")
	}
}
