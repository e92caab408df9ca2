package stmt

import (
	"bytes"
	"io/fs"
	"maps"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

// Every valid schema name gets a channel PostgreSQL accepts as is, short
// names keep their readable form, and long names sharing a prefix differ.
func TestChannelFitsIdentifier(t *testing.T) {
	if got := New("queen").Channel; got != "queen_queen" {
		t.Fatalf("channel of queen = %q", got)
	}
	seen := map[string]bool{}
	for n := 1; n <= 63; n++ {
		for _, last := range []string{"a", "b"} {
			schema := strings.Repeat("s", n-1) + last
			c := New(schema).Channel
			if len(c) > maxIdentifier {
				t.Fatalf("schema of %d bytes: channel %q is %d bytes", n, c, len(c))
			}
			if seen[c] {
				t.Fatalf("schema %q: channel %q repeats another schema's", schema, c)
			}
			seen[c] = true
		}
	}
}

// Every statement field is filled from the .sql files and rendered for the
// schema, with no placeholder left.
func TestStatementsRendered(t *testing.T) {
	for _, v := range []any{New("some_schema"), NewConsume("some_schema")} {
		rv := reflect.ValueOf(v).Elem()
		fields := sqlFields(rv)
		if len(fields) < 10 {
			t.Fatalf("%T: only %d statement fields", v, len(fields))
		}
		for _, f := range fields {
			sql := rv.FieldByName(f).String()
			if sql == "" || strings.Contains(sql, "{{") || strings.HasPrefix(sql, "--") {
				t.Errorf("%s = %q", f, sql)
			}
			if f != "Notify" && f != "NotifyAlone" && !strings.Contains(sql, `"some_schema".`) {
				t.Errorf("%s names no object of the schema: %q", f, sql)
			}
		}
	}
}

// A statement set that does not fill exactly the fields is refused with an
// error naming the problem, never a panic.
func TestParseRejectsMismatch(t *testing.T) {
	full := fstest.MapFS{}
	for _, name := range mustGlob(t) {
		b, err := fs.ReadFile(Files(), name)
		if err != nil {
			t.Fatal(err)
		}
		full[name] = &fstest.MapFile{Data: b}
	}
	if _, err := parse(full, nil); err != nil {
		t.Fatalf("the embedded files: %v", err)
	}
	for name, tc := range map[string]struct {
		extra string
		want  string
	}{
		"unknown name": {"-- name: NoSuchField\nSELECT 1\n", "fills no field"},
		"duplicate":    {"-- name: Pop\nSELECT 1\n", "defined twice"},
		"empty":        {"-- name: Extra\n-- only a comment\n", "is empty"},
		"no name":      {"-- name: \nSELECT 1\n", "without a name"},
	} {
		fsys := maps.Clone(full)
		fsys["zz.sql"] = &fstest.MapFile{Data: []byte("-- test\n" + tc.extra)}
		if _, err := parse(fsys, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	missing := maps.Clone(full)
	delete(missing, "consume.sql")
	if _, err := parse(missing, nil); err == nil || !strings.Contains(err.Error(), "no statement for field") {
		t.Errorf("a missing file: %v", err)
	}
}

// Use swaps the statement source for New until restored.
func TestUse(t *testing.T) {
	fsys := fstest.MapFS{}
	for _, name := range mustGlob(t) {
		b, _ := fs.ReadFile(Files(), name)
		fsys[name] = &fstest.MapFile{Data: bytes.ReplaceAll(b, []byte("SELECT maintenance FROM"), []byte("SELECT maintenance /* other */ FROM"))}
	}
	restore, err := Use(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if got := New("s").GetMaintenance; !strings.Contains(got, "/* other */") {
		restore()
		t.Fatalf("with Use: %q", got)
	}
	restore()
	if got := New("s").GetMaintenance; strings.Contains(got, "/* other */") {
		t.Fatalf("after restore: %q", got)
	}
	if _, err := Use(fstest.MapFS{}); err == nil {
		t.Fatal("an empty statement set accepted")
	}
}

// A previous release's files lack the statements this release added: Use
// takes them and leaves those fields empty; the embedded set must have
// every one, and Use no other missing.
func TestUseWithoutAddedStatements(t *testing.T) {
	if len(added) == 0 {
		t.Skip("this release added no statement")
	}
	_, err := parse(os.DirFS("testdata/v5"), nil)
	if err == nil {
		t.Fatal("the previous release's files fill every field; added lists statements it had")
	}
	for f := range added {
		if _, ok := (*builtin)[f]; !ok {
			t.Errorf("added names %s, which the embedded files do not fill", f)
		}
	}
	prev, err := parse(os.DirFS("testdata/v5"), added)
	if err != nil {
		t.Fatal(err)
	}
	for f := range added {
		if _, ok := (*prev)[f]; ok {
			t.Errorf("the previous release already had %s", f)
		}
	}
	restore, err := Use(os.DirFS("testdata/v5"))
	if err != nil {
		t.Fatal(err)
	}
	s := New("s")
	restore()
	if s.AppendSegment != "" || s.PushSegment == "" {
		t.Fatalf("with the previous release's files: AppendSegment %q, PushSegment %q", s.AppendSegment, s.PushSegment)
	}
	missing := fstest.MapFS{}
	for _, name := range mustGlob(t) {
		b, _ := fs.ReadFile(Files(), name)
		if name == "queue.sql" {
			continue
		}
		missing[name] = &fstest.MapFile{Data: b}
	}
	if _, err := Use(missing); err == nil || !strings.Contains(err.Error(), "no statement for field") {
		t.Fatalf("Use without queue.sql: %v", err)
	}
}

func mustGlob(t *testing.T) []string {
	t.Helper()
	names, err := fs.Glob(Files(), "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("embedded files %v %v", names, err)
	}
	return names
}

// Args cuts the arguments to the highest parameter a statement names.
func TestPrefixArgs(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		args int
		want int
	}{
		{"SELECT 1", 2, 0},
		{"SELECT $1, $2", 2, 2},
		{"SELECT $2::int8, $1", 3, 2},
		{"SELECT f($9::text, $10::text, $16::bytea[])", 16, 16},
		{"SELECT f($9::text, $10::text, $15::bytea[])", 16, 15},
		{"SELECT $20", 3, 3}, // never more than given: pgx reports the shortfall
	} {
		args := make([]any, tc.args)
		if got := len(prefixArgs(tc.sql, args...)); got != tc.want {
			t.Errorf("prefixArgs(%q, %d arguments) kept %d, want %d", tc.sql, tc.args, got, tc.want)
		}
	}
}

// castRE finds a parameter with its cast, e.g. $4::bytea[].
var castRE = regexp.MustCompile(`\$(\d+)::([a-z0-9_]+(?:\[\])?)`)

// The client passes every statement its current arguments and Args gives
// the previous release's statement (see Use) the prefix it names, so a
// statement's parameters are only ever appended to: each parameter of the
// previous release's statement has the type the current one gives it.
func TestPreviousStatementsTakeAPrefix(t *testing.T) {
	prev, err := parse(os.DirFS("testdata/v5"), added)
	if err != nil {
		t.Fatal(err)
	}
	casts := func(sql string) map[string]string {
		out := map[string]string{}
		for _, m := range castRE.FindAllStringSubmatch(sql, -1) {
			out[m[1]] = m[2]
		}
		return out
	}
	for name, old := range *prev {
		cur := (*builtin)[name]
		if n, m := len(prefixArgs(old, make([]any, 99)...)), len(prefixArgs(cur, make([]any, 99)...)); n > m {
			t.Errorf("%s: the previous release's statement names %d parameters, the current one %d", name, n, m)
		}
		now := casts(cur)
		for k, typ := range casts(old) {
			if now[k] != "" && now[k] != typ {
				t.Errorf("%s: $%s is %s, was %s in the previous release", name, k, now[k], typ)
			}
		}
	}
}
