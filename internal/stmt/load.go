package stmt

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// The statements live in *.sql files of this directory, each a run of
// blocks
//
//	-- name: Field
//	-- comments (not sent)
//	SELECT ... {{schema}}.f($1)
//
// where Field is the name of the Set or Consume field the statement fills
// and {{schema}} is replaced by the quoted schema name.
//
//go:embed *.sql
var embedded embed.FS

// notSQL are the string fields of Set that hold no statement.
var notSQL = map[string]bool{"Schema": true, "Channel": true}

// library is one parsed set of statement files.
type library map[string]string

var (
	builtin = mustParse(embedded)
	active  atomic.Pointer[library]
)

func mustParse(fsys fs.FS) *library {
	l, err := parse(fsys, nil)
	if err != nil {
		panic(err) // the embedded files are part of the build
	}
	return l
}

func current() *library {
	if l := active.Load(); l != nil {
		return l
	}
	return builtin
}

// added are the statement fields this release added. A previous release's
// files (see Use) lack them: their fields stay empty, and the client does
// what that release did without them.
var added = map[string]bool{"AppendSegment": true, "MarkKeyed": true, "DiscardDeadLetters": true,
	"DeadLetterRetentionStep": true, "DeadLetterCounts": true, "Schedule": true, "MoveScheduled": true,
	"CancelScheduled": true, "ScheduledStatus": true, "ExpireMembers": true, "MemberBeat": true, "MemberLeave": true,
	"Members": true, "ResetGroup": true, "DeleteGroup": true, "ReleaseLease": true,
	"TakeSamples": true, "Samples": true, "PopAhead": true, "SegmentBlob": true, "NotifyAlone": true,
	"PopLinger": true, "LingerAck": true, "PushTake": true, "StatusRouted": true, "LagByGroupRouted": true, "QueuesRouted": true}

// parse reads every *.sql file at the root of fsys and checks that its
// statements fill exactly the statement fields of Set and Consume, but for
// those in optional, which may be missing.
func parse(fsys fs.FS, optional map[string]bool) (*library, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	l := library{}
	for _, file := range names {
		body, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		if err := l.add(file, string(body)); err != nil {
			return nil, err
		}
	}
	want := map[string]bool{}
	for _, v := range []any{&Set{}, &Consume{}} {
		for _, f := range sqlFields(reflect.ValueOf(v).Elem()) {
			want[f] = true
			if _, ok := l[f]; !ok && !optional[f] {
				return nil, fmt.Errorf("stmt: no statement for field %s", f)
			}
		}
	}
	for n := range l {
		if !want[n] {
			return nil, fmt.Errorf("stmt: statement %s fills no field", n)
		}
	}
	return &l, nil
}

const marker = "-- name: "

func (l library) add(file, body string) error {
	blocks := strings.Split(body, "\n"+marker)
	// What precedes the first marker is the file's own comment.
	for _, b := range blocks[1:] {
		name, text, _ := strings.Cut(b, "\n")
		name = strings.TrimSpace(name)
		lines := strings.Split(text, "\n")
		for len(lines) > 0 && strings.HasPrefix(lines[0], "--") {
			lines = lines[1:]
		}
		text = strings.TrimRight(strings.Join(lines, "\n"), " \t\n")
		switch {
		case name == "":
			return fmt.Errorf("stmt: %s: a block without a name", file)
		case text == "":
			return fmt.Errorf("stmt: %s: statement %s is empty", file, name)
		}
		if _, dup := l[name]; dup {
			return fmt.Errorf("stmt: %s: statement %s defined twice", file, name)
		}
		l[name] = text
	}
	return nil
}

// sqlFields names the statement fields of a Set or Consume.
func sqlFields(v reflect.Value) []string {
	var out []string
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type.Kind() == reflect.String && !notSQL[f.Name] {
			out = append(out, f.Name)
		}
	}
	return out
}

// fill renders every statement field of dst (a *Set or *Consume) for schema.
func (l *library) fill(dst any, schema string) {
	r := strings.NewReplacer("{{schema}}", pgx.Identifier{schema}.Sanitize())
	v := reflect.ValueOf(dst).Elem()
	for _, f := range sqlFields(v) {
		v.FieldByName(f).SetString(r.Replace((*l)[f]))
	}
}

// Use makes New and NewConsume render the statements of fsys instead of
// the embedded ones until the returned function is called: for tests that
// run a client with another release's statements beside the current one.
// The statements this release added may be missing from fsys.
func Use(fsys fs.FS) (restore func(), err error) {
	l, err := parse(fsys, added)
	if err != nil {
		return nil, err
	}
	prev := active.Swap(l)
	return func() { active.Store(prev) }, nil
}

// Files returns the embedded statement files.
func Files() fs.FS { return embedded }

// scanPrefix runs sql on q (a pool, a connection or a transaction) and scans
// the first columns of its first row into dest, as many as both have: a
// statement's columns are only ever appended to, so a previous release's
// statement (see Use) fills the prefix of dest it has and leaves the rest
// alone, and a caller that needs only the first columns names only those.
// pgx.ErrNoRows when there is no row. With as many destinations as columns
// it is pgx's QueryRow over a Querier.
func scanPrefix(ctx context.Context, q Querier, sql string, args []any, dest ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if n := len(rows.FieldDescriptions()); n < len(dest) {
		dest = dest[:n]
	} else if n > len(dest) {
		dest = append(dest[:len(dest):len(dest)], make([]any, n-len(dest))...) // nil: column skipped
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// prefixArgs returns args cut to the highest parameter ($n) sql names. A
// statement's parameters are only ever appended to, so the current client
// passes its full list and a statement of the previous release (see Use),
// which names fewer, gets the prefix that release passed.
func prefixArgs(sql string, args ...any) []any {
	n := 0
	for i := 0; i < len(sql); i++ {
		if sql[i] != '$' {
			continue
		}
		k := 0
		for i+1 < len(sql) && sql[i+1] >= '0' && sql[i+1] <= '9' {
			i++
			k = k*10 + int(sql[i]-'0')
		}
		n = max(n, k)
	}
	if n < len(args) {
		return args[:n]
	}
	return args
}
