package sqlschema

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed functions/*.sql
var functionFS embed.FS

// FunctionsRevision numbers the function layer (functions/*.sql). It goes
// up by one whenever any of those files changes, so a database can tell
// which of two binaries carries the newer functions; testdata/functions.sum
// pins each revision's hash and its test fails on an edit without a bump.
const FunctionsRevision = 3

// FunctionFile is one file of the function layer: CREATE OR REPLACE
// definitions of the functions and views of one concern.
type FunctionFile struct {
	Name     string // the file name, e.g. "push.sql"
	template string
}

// SQL renders the file for schema.
func (f FunctionFile) SQL(schema string) string { return render(f.template, schema) }

var functionFiles, functionsHash = mustLoadFunctions()

func mustLoadFunctions() ([]FunctionFile, string) {
	entries, err := fs.ReadDir(functionFS, "functions")
	if err != nil {
		panic(err)
	}
	var out []FunctionFile
	for _, e := range entries {
		body, err := functionFS.ReadFile("functions/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, FunctionFile{Name: e.Name(), template: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	h := sha256.New()
	for _, f := range out {
		// Name and length frame each file, so moving text between files
		// changes the hash too.
		fmt.Fprintf(h, "%s\x00%d\x00%s", f.Name, len(f.template), f.template)
	}
	return out, hex.EncodeToString(h.Sum(nil))
}

// FunctionFiles returns the function layer in the order Migrate applies it
// (by file name).
func FunctionFiles() []FunctionFile { return append([]FunctionFile(nil), functionFiles...) }

// FunctionsHash is the hex SHA-256 of the function layer's templates,
// independent of the schema name.
func FunctionsHash() string { return functionsHash }

// FunctionsState is the row of the schema_functions table: which function
// layer the database holds.
type FunctionsState struct {
	Version  int    // the newest migration of the binary that applied it
	Revision int    // its FunctionsRevision
	Hash     string // its FunctionsHash
}

const functionsTableSQL = `CREATE TABLE IF NOT EXISTS {{schema}}.schema_functions (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    version    integer     NOT NULL,
    revision   integer     NOT NULL,
    hash       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

// readFunctions returns the recorded state, or ok false when none is.
func readFunctions(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string) (FunctionsState, bool, error) {
	var s FunctionsState
	err := q.QueryRow(ctx, "SELECT version, revision, hash FROM "+
		pgx.Identifier{schema, "schema_functions"}.Sanitize()).Scan(&s.Version, &s.Revision, &s.Hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("sqlschema: read function layer: %w", err)
	}
	return s, true, nil
}

// checkFunctions fails with ErrSchemaTooNew for a function layer applied
// by a binary that knows newer migrations.
func checkFunctions(s FunctionsState, ok bool) error {
	if ok && s.Version > Latest() {
		return fmt.Errorf("%w: functions applied for version %d, binary knows %d", ErrSchemaTooNew, s.Version, Latest())
	}
	return nil
}

// wantFunctions reports whether this binary should (re)apply its function
// layer over the recorded one: never over a newer revision, which the
// naming rule keeps callable by this binary's statements.
func wantFunctions(s FunctionsState, ok bool) bool {
	if !ok || s.Revision < FunctionsRevision {
		return true
	}
	// Same revision, other text: a build that edited the files without a
	// bump (the functions.sum test stops that from being committed). The
	// binary's own text wins so development databases follow the tree.
	return s.Revision == FunctionsRevision && s.Hash != functionsHash
}

// customPlansSQL makes every function of the layer that plans its
// statements generically (SET plan_cache_mode = force_generic_plan, for
// PostgreSQL's sake) plan them for their parameters instead, on the routed
// layout only (settings.routed, set by Distribute): Citus cannot plan a
// join of distributed tables, even on one shard, without the parameters'
// values ("could not create distributed plan"). Run after the layer is
// (re)applied and by Distribute.
const customPlansSQL = `DO $custom$
DECLARE
    f regprocedure;
BEGIN
    IF (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) THEN
        FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                 WHERE p.pronamespace = '{{schema}}'::regnamespace
                   AND 'plan_cache_mode=force_generic_plan' = ANY (p.proconfig) LOOP
            EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_custom_plan', f);
        END LOOP;
    END IF;
END
$custom$`

// functionsSQL renders the function layer and its state row as one script.
func functionsSQL(schema string) string {
	var b strings.Builder
	// Definitions may call functions of a later file; each body is checked
	// when it first runs, as plpgsql bodies always are.
	b.WriteString("SET LOCAL check_function_bodies = off;\n")
	for _, f := range functionFiles {
		fmt.Fprintf(&b, "\n-- functions/%s\n%s\n", f.Name, f.SQL(schema))
	}
	fmt.Fprintf(&b, "\n%s;\n", render(customPlansSQL, schema))
	fmt.Fprintf(&b, "\nINSERT INTO %s (id, version, revision, hash) VALUES (true, %d, %d, '%s')\n"+
		"ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version, revision = EXCLUDED.revision,\n"+
		"    hash = EXCLUDED.hash, applied_at = now();\n",
		pgx.Identifier{schema, "schema_functions"}.Sanitize(), Latest(), FunctionsRevision, functionsHash)
	return b.String()
}

// applyFunctions (re)creates the function layer in one transaction if the
// recorded one is older or differs; it reports whether it did.
func applyFunctions(ctx context.Context, conn *pgx.Conn, schema string) (bool, error) {
	applied := false
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// Under the migration lock already; the row lock orders this
		// against a Script applied by hand at the same time.
		if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, "schema_functions"}.Sanitize()+" IN EXCLUSIVE MODE"); err != nil {
			return err
		}
		s, ok, err := readFunctions(ctx, tx, schema)
		if err != nil {
			return err
		}
		if err := checkFunctions(s, ok); err != nil {
			return err
		}
		if !wantFunctions(s, ok) {
			return nil
		}
		if _, err := tx.Exec(ctx, functionsSQL(schema)); err != nil {
			return err
		}
		applied = true
		return nil
	})
	if err != nil && !errors.Is(err, ErrSchemaTooNew) {
		err = fmt.Errorf("sqlschema: function layer: %w", err)
	}
	return applied, err
}

// Functions reports the function layer recorded in schema; ok is false when
// none is (a schema not migrated by this version or later).
func Functions(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string) (s FunctionsState, ok bool, err error) {
	if err := ValidSchema(schema); err != nil {
		return s, false, err
	}
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{schema, "schema_functions"}.Sanitize()).Scan(&exists); err != nil || !exists {
		return s, false, err
	}
	return readFunctions(ctx, q, schema)
}
