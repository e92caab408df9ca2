package sqlschema_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// lease_yields runs in every pop_linger, linger_ack and pop_ahead, so once
// per message on the lingering lease's path. A LANGUAGE sql function that
// the planner cannot inline (its EXISTS subqueries forbid that) runs
// through the SQL-function executor, which parses and plans its body again
// in each transaction: with track_functions = 'all' such a call is counted
// under its own name, an inlined one is not.
func TestLeaseYieldsRunsNoSQLFunctionBody(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL track_functions = 'all'"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var y bool
		if err := tx.QueryRow(ctx, "SELECT "+s+".lease_yields(1, 'g', 2)").Scan(&y); err != nil {
			t.Fatal(err)
		}
		if y {
			t.Fatal("lease_yields on an empty schema: true, want false")
		}
	}
	rows, err := tx.Query(ctx, `SELECT p.proname, f.calls FROM pg_stat_xact_user_functions f
JOIN pg_proc p ON p.oid = f.funcid JOIN pg_language l ON l.oid = p.prolang
WHERE l.lanname = 'sql' AND f.schemaname = $1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	type call struct {
		Name  string
		Calls int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[call])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) > 0 {
		t.Errorf("lease_yields ran SQL function bodies, planned per transaction: %v", got)
	}
}

// partition_key runs wherever the server derives a partition's id: in
// push_segment on every isolated push it serves, in partition_of, and per
// new partition in push_bundle. Declared IMMUTABLE with convert_to (STABLE)
// in its body it was not inlined, and each call ran the SQL-function
// executor; counted as in TestLeaseYieldsRunsNoSQLFunctionBody.
func TestPartitionKeyRunsNoSQLFunctionBody(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL track_functions = 'all'"); err != nil {
		t.Fatal(err)
	}
	var n int64
	// Arguments from a column, so that no call is folded at plan time.
	if err := tx.QueryRow(ctx, "SELECT count(DISTINCT "+s+".partition_key(q, 'p' || q, 0)) FROM generate_series(1, 3) q").Scan(&n); err != nil || n != 3 {
		t.Fatalf("three partition keys: %d distinct, %v", n, err)
	}
	var id *int64
	if err := tx.QueryRow(ctx, "SELECT "+s+".partition_of(1, 'none')").Scan(&id); err != nil || id != nil {
		t.Fatalf("partition_of on an empty schema: %v, %v; want NULL", id, err)
	}
	rows, err := tx.Query(ctx, `SELECT p.proname, f.calls FROM pg_stat_xact_user_functions f
JOIN pg_proc p ON p.oid = f.funcid JOIN pg_language l ON l.oid = p.prolang
WHERE l.lanname = 'sql' AND f.schemaname = $1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	type call struct {
		Name  string
		Calls int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[call])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) > 0 {
		t.Errorf("partition_key ran as a SQL function body, not inlined: %v", got)
	}
}
