// Package sqlschema holds queen's PostgreSQL schema and applies it. It has
// two layers:
//
//   - Migrations (migrations/NNN_name.sql): numbered, applied once each, never
//     edited once released (a checksum guards them). They hold the stored
//     state: tables, indexes, types, constraints and data fixes, never a
//     function or view. (Before the first release, migrations 002-004 also
//     defined the engine's functions; a database that applied that earlier
//     text is accepted, its checksums listed in legacyChecksums, since the
//     function layer re-creates the same definitions.)
//   - The function layer (functions/*.sql, one concern per file): CREATE OR
//     REPLACE definitions of every function and view, as they are now. It is
//     edited in place, like Go code. [Migrate] applies it after the
//     migrations, under the same advisory lock and in one transaction,
//     whenever the database records an older [FunctionsRevision], or the same
//     one with another [FunctionsHash], in the schema_functions table (with
//     the migration version of the binary that applied it).
//
// Versioning rules, so that two adjacent releases can run side by side
// during a rolling upgrade:
//
//   - A binary never overwrites a newer function layer: a database whose
//     recorded layer has a higher revision keeps it, and one whose migrations
//     or recorded layer are ahead of the binary's newest migration fails with
//     [ErrSchemaTooNew] before anything is touched.
//   - A change to a function's signature, result columns or semantics (what
//     a caller may observe, status codes included) gives it a new name (a
//     suffix: pop_v2); the old name stays, unchanged, for at least the next
//     release, since older processes still call it. Only a body change that
//     callers cannot tell apart (a faster plan, a fix that every caller
//     wants) keeps the name.
//   - Every edit of functions/*.sql bumps FunctionsRevision and appends the
//     new hash to testdata/functions.sum (a test fails otherwise).
//   - Dropping a function that no supported release calls any more is a
//     migration.
//
// Templates render for one schema ({{schema}} is the quoted name), so one
// set serves any number of independent schemas in a database. [Migrate]
// applies what is missing, one transaction per version (including its row
// in the version table), under a PostgreSQL advisory lock, so any number of
// processes may call it at once.
//
// Teams that run their own migration tool can take the SQL text from
// [Script] (which ends with the function layer) instead of letting
// queen.Open apply it.
package sqlschema

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/zeebo/xxh3"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

var (
	// ErrSchemaTooNew means the database has migrations this binary does not
	// know, or functions a binary with such migrations applied: a newer
	// release migrated it. Upgrade the binary.
	ErrSchemaTooNew = errors.New("queen: database schema is newer than this binary")
	// ErrChecksumMismatch means an applied migration's text differs from the
	// embedded one. Applied migrations are never re-run.
	ErrChecksumMismatch = errors.New("queen: applied migration differs from the embedded one")
	// ErrInvalidSchema is returned for a schema name that is not a plain
	// lower-case identifier.
	ErrInvalidSchema = errors.New("queen: invalid schema name")
)

// Migration is one numbered step of the schema.
type Migration struct {
	Version  int
	Name     string
	Checksum string // hex SHA-256 of the template, independent of the schema name
	template string
}

// SQL renders the migration for schema.
func (m Migration) SQL(schema string) string {
	return render(m.template, schema)
}

var migrations = mustLoad()

// mustLoad panics on a malformed set: that is a build defect, never a runtime
// condition.
func mustLoad() []Migration {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		panic(err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			panic("sqlschema: malformed migration file name " + name)
		}
		body, err := migrationFS.ReadFile("migrations/" + name)
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(body)
		out = append(out, Migration{Version: v, Name: rest, Checksum: hex.EncodeToString(sum[:]), template: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			panic(fmt.Sprintf("sqlschema: migrations not contiguous: want version %d, have %d", i+1, m.Version))
		}
	}
	return out
}

// Migrations returns every embedded migration in version order.
func Migrations() []Migration { return append([]Migration(nil), migrations...) }

// Latest is the newest version this binary knows.
func Latest() int { return len(migrations) }

var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidSchema reports whether name can be used as a schema: a lower-case
// identifier of at most 63 bytes, so it never needs quoting games.
func ValidSchema(name string) error {
	if !schemaRE.MatchString(name) || strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("%w: %q", ErrInvalidSchema, name)
	}
	return nil
}

func render(tmpl, schema string) string {
	return strings.NewReplacer(
		"{{schema}}", pgx.Identifier{schema}.Sanitize(),
		"{{schema_name}}", schema,
	).Replace(tmpl)
}

// Script renders migrations (from, to] for schema as one SQL script that also
// maintains the version table, for teams that apply SQL with their own tool.
// When to is Latest it ends with the function layer; apply the script of a
// binary only to a database no newer binary has migrated (Migrate checks
// that, a script cannot).
func Script(schema string, from, to int) (string, error) {
	if err := ValidSchema(schema); err != nil {
		return "", err
	}
	if from < 0 || to > Latest() || from > to {
		return "", fmt.Errorf("sqlschema: bad range (%d, %d], latest is %d", from, to, Latest())
	}
	var b strings.Builder
	b.WriteString(render(bootstrapSQL, schema))
	b.WriteString(";\n")
	for _, m := range migrations[from:to] {
		fmt.Fprintf(&b, "\n-- version %d: %s\nBEGIN;\n%s\n", m.Version, m.Name, m.SQL(schema))
		fmt.Fprintf(&b, "INSERT INTO %s.schema_migrations (version, name, checksum) VALUES (%d, '%s', '%s');\nCOMMIT;\n",
			pgx.Identifier{schema}.Sanitize(), m.Version, m.Name, m.Checksum)
	}
	// The function layer is written for the newest migrations only.
	if to == Latest() {
		fmt.Fprintf(&b, "\n-- function layer, revision %d\nBEGIN;\n%sCOMMIT;\n", FunctionsRevision, functionsSQL(schema))
	}
	return b.String(), nil
}

const bootstrapSQL = `CREATE SCHEMA IF NOT EXISTS {{schema}};
CREATE TABLE IF NOT EXISTS {{schema}}.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
` + functionsTableSQL

// lockKey is the advisory lock that serializes migrations of one schema
// across processes.
func lockKey(schema string) int64 {
	return int64(xxh3.HashString("queen:migrate:" + schema))
}

// Applied is one row of the version table.
type Applied struct {
	Version  int
	Name     string
	Checksum string
}

// Migrate brings schema up to Latest, then (re)applies the function layer if
// the database holds an older one (see the package doc). It is safe to call
// concurrently from many processes: an advisory lock serializes them and
// each migration is applied exactly once. It returns the versions it
// applied.
//
// It fails with ErrSchemaTooNew, having changed nothing, if the database's
// migrations or function layer are ahead of this binary, and with
// ErrChecksumMismatch if an applied migration's text changed.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	if err := ValidSchema(schema); err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlschema: acquire: %w", err)
	}
	defer conn.Release()

	key := lockKey(schema)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return nil, fmt.Errorf("sqlschema: advisory lock: %w", err)
	}
	defer func() {
		// A cancelled ctx must not leave the session lock behind on a pooled
		// connection; if the unlock itself fails, drop the connection.
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", key); err != nil {
			_ = conn.Conn().Close(context.Background())
		}
	}()

	if _, err := conn.Exec(ctx, render(bootstrapSQL, schema)); err != nil {
		return nil, fmt.Errorf("sqlschema: create version table: %w", err)
	}
	applied, err := readApplied(ctx, conn.Conn(), schema)
	if err != nil {
		return nil, err
	}
	if err := check(applied); err != nil {
		return nil, err
	}
	fstate, ok, err := readFunctions(ctx, conn.Conn(), schema)
	if err != nil {
		return nil, err
	}
	if err := checkFunctions(fstate, ok); err != nil {
		return nil, err
	}
	var done []int
	for _, m := range migrations[len(applied):] {
		err := pgx.BeginFunc(ctx, conn.Conn(), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL(schema)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "schema_migrations"}.Sanitize()+
				" (version, name, checksum) VALUES ($1, $2, $3)", m.Version, m.Name, m.Checksum)
			return err
		})
		if err != nil {
			return done, fmt.Errorf("sqlschema: migration %d (%s): %w", m.Version, m.Name, err)
		}
		done = append(done, m.Version)
	}
	if _, err := applyFunctions(ctx, conn.Conn(), schema); err != nil {
		return done, err
	}
	return done, nil
}

// Version reports the versions applied to schema (empty if none).
func Version(ctx context.Context, pool *pgxpool.Pool, schema string) ([]Applied, error) {
	if err := ValidSchema(schema); err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{schema, "schema_migrations"}.Sanitize()).Scan(&exists); err != nil {
		return nil, err
	}
	if !exists {
		return nil, nil
	}
	return readApplied(ctx, conn.Conn(), schema)
}

func readApplied(ctx context.Context, conn *pgx.Conn, schema string) ([]Applied, error) {
	rows, err := conn.Query(ctx, "SELECT version, name, checksum FROM "+
		pgx.Identifier{schema, "schema_migrations"}.Sanitize()+" ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("sqlschema: read versions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Applied, error) {
		var a Applied
		err := r.Scan(&a.Version, &a.Name, &a.Checksum)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("sqlschema: read versions: %w", err)
	}
	return out, nil
}

// legacyChecksums are earlier texts of migrations that a database may have
// applied and that count as the current one: migrations 2-4 defined the
// engine's functions and view until those moved to the function layer,
// which re-creates the same definitions; the tables, indexes and types
// they create did not change.
var legacyChecksums = map[int][]string{
	2: {"c9bda8ab0399f3ed70d5bc8969ab9e91a22b6d181460fbc6b54640bd1e5f51fc"},
	3: {"b0dff00e58e68adeceda3e20ab2e9fc8220eab3ec48fe6e776778d5dc760a331"},
	4: {"680a50ca95296209cebe1f4acc8f588911c7e1745e390f0b64b4aa60c9042978"},
}

// check validates the applied set against the embedded one.
func check(applied []Applied) error {
	for i, a := range applied {
		if a.Version > Latest() {
			return fmt.Errorf("%w: database at version %d, binary knows %d", ErrSchemaTooNew, applied[len(applied)-1].Version, Latest())
		}
		if a.Version != i+1 {
			return fmt.Errorf("sqlschema: version table has a gap: version %d at position %d", a.Version, i+1)
		}
		if m := migrations[i]; a.Checksum != m.Checksum && !slices.Contains(legacyChecksums[a.Version], a.Checksum) {
			return fmt.Errorf("%w: version %d (%s)", ErrChecksumMismatch, a.Version, m.Name)
		}
	}
	return nil
}
