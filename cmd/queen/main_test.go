package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest"
	"github.com/e03140bc/queen/sqlschema"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata (and the dashboard screenshot)")

func TestMain(m *testing.M) { queentest.Main(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

func runCLI(ctx context.Context, args ...string) result {
	var out, errb bytes.Buffer
	code := run(ctx, args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// normalizer replaces what differs between runs: the schema, the URL,
// times, ids, ages and the lease holder; then runs of spaces, whose width
// follows those values in tables.
type normalizer struct{ schema, url string }

var (
	reTime   = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	reUUID   = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	reOwner  = regexp.MustCompile(`[^\s/"]+/\d+/[0-9a-f]{8}`)
	reAge    = regexp.MustCompile(`(^|[\s(=])(<1s|(\d+h)?(\d+m)?\d+(\.\d+)?s)\b`)
	reAgeKey = regexp.MustCompile(`"(\w*age_seconds)": [0-9.e+-]+`)
	reSpaces = regexp.MustCompile(`(\S) {2,}`)
)

func (n normalizer) apply(s string) string {
	if n.url != "" {
		s = strings.ReplaceAll(s, n.url, "<url>")
	}
	if n.schema != "" {
		s = strings.ReplaceAll(s, n.schema, "<schema>")
	}
	s = reTime.ReplaceAllString(s, "<time>")
	s = reUUID.ReplaceAllString(s, "<uuid>")
	s = reOwner.ReplaceAllString(s, "<owner>")
	s = reAge.ReplaceAllString(s, "$1<age>")
	s = reAgeKey.ReplaceAllString(s, `"$1": <age>`)
	return reSpaces.ReplaceAllString(s, "$1  ")
}

// golden compares the normalized transcript of a run with
// testdata/<name>.golden, or rewrites it with -update.
func golden(t *testing.T, name string, n normalizer, args []string, r result) {
	t.Helper()
	shown := make([]string, len(args))
	for i, a := range args {
		shown[i] = a
		if strings.ContainsAny(a, " \"'<>") || a == "" || strconv.Quote(a) != `"`+a+`"` {
			shown[i] = fmt.Sprintf("%q", a)
		}
	}
	got := n.apply(fmt.Sprintf("$ queen %s\n%s--- stderr\n%s--- exit %d\n", strings.Join(shown, " "), r.stdout, r.stderr, r.code))
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s: output differs from %s (go test -update rewrites it):\n--- got\n%s--- want\n%s", name, path, got, want)
	}
}

func push(t *testing.T, q *queen.Queue, items ...queen.Item) {
	t.Helper()
	res, err := q.Push(ctxT(t), items)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != queen.Queued {
			t.Fatalf("push %d: %s %v", i, r.Status, r.Err)
		}
	}
}

func pop(t *testing.T, q *queen.Queue, o queen.PopOptions) []*queen.Message {
	t.Helper()
	o.Wait = 5 * time.Second
	msgs, err := q.Pop(ctxT(t), o)
	if err != nil || len(msgs) == 0 {
		t.Fatalf("pop %+v: %d messages, %v", o, len(msgs), err)
	}
	return msgs
}

// fixture fills a schema: queue "orders" with partitions eu (3 messages,
// one consumed, one leased) and us (2 messages, one dead-lettered, one
// binary), a paused group, and an empty configured queue.
func fixture(t *testing.T) (*queen.Client, normalizer) {
	t.Helper()
	c := queentest.Open(t)
	ctx := ctxT(t)
	orders := c.Queue("orders")
	if err := orders.Configure(ctx, queen.QueueOptions{DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.Queue("empty").Configure(ctx, queen.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	push(t, orders,
		queen.Item{Partition: "eu", TransactionID: "eu-1", Data: []byte(`{"sku":"tea"}`)},
		queen.Item{Partition: "eu", TransactionID: "eu-2", Data: []byte(`{"sku":"coffee"}`), Headers: map[string]string{"trace": "t1"}},
		queen.Item{Partition: "eu", TransactionID: "eu-3", Data: []byte("\x1b[31mred\x1b[0m")},
	)
	push(t, orders,
		queen.Item{Partition: "us", TransactionID: "us-1", Data: []byte(`{"sku":"<script>alert(1)</script>"}`)},
		queen.Item{Partition: "us", TransactionID: "us-2", Data: []byte{0xff, 0x00, 0x10}},
	)
	// eu: offset 0 acked, 1 leased.
	m := pop(t, orders, queen.PopOptions{Partition: "eu", Batch: 1})
	if err := m[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	pop(t, orders, queen.PopOptions{Partition: "eu", Batch: 1})
	// us: offset 0 dead-lettered.
	m = pop(t, orders, queen.PopOptions{Partition: "us", Batch: 1})
	if err := m[0].DeadLetter(ctx, errors.New("bad sku\tlook")); err != nil {
		t.Fatal(err)
	}
	if err := orders.Pause(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	return c, normalizer{schema: c.Schema(), url: queentest.URL(t)}
}

// TestGolden runs the commands in order against one schema; each run's
// output, stderr and exit code are compared with testdata/<step>.golden.
func TestGolden(t *testing.T) {
	c, n := fixture(t)
	ctx := ctxT(t)
	db := []string{"--database-url", queentest.URL(t), "--schema", c.Schema()}
	steps := []struct {
		name string
		args []string
	}{
		{"queues", []string{"queues"}},
		{"queues-json", []string{"queues", "--json"}},
		{"status", []string{"status", "orders"}},
		{"status-json", []string{"--json", "status", "orders"}},
		{"status-empty", []string{"status", "empty"}},
		{"status-unknown", []string{"status", "nope"}},
		{"tail", []string{"tail", "orders"}},
		{"tail-limit", []string{"tail", "orders", "--partition", "eu", "--limit", "1"}},
		{"tail-json", []string{"tail", "orders", "--partition", "us", "--from", "1", "--json"}},
		{"tail-unknown-partition", []string{"tail", "orders", "--partition", "zz"}},
		{"dlq-list", []string{"dlq", "list", "orders"}},
		{"dlq-list-json", []string{"dlq", "list", "orders", "--json"}},
		{"dlq-list-filtered", []string{"dlq", "list", "orders", "--partition", "eu"}},
		{"dlq-replay-dry-run", []string{"dlq", "replay", "orders", "--dry-run"}},
		{"dlq-discard-dry-run", []string{"dlq", "discard", "orders", "--partition", "us", "--dry-run"}},
		{"dlq-replay", []string{"dlq", "replay", "orders"}},
		{"dlq-replay-nothing", []string{"dlq", "replay", "orders"}},
		{"dlq-discard-nothing", []string{"dlq", "discard", "orders", "--id", "1"}},
		{"dlq-discard-nothing-json", []string{"dlq", "discard", "orders", "--json"}},
		{"dlq-list-after-replay", []string{"dlq", "list", "orders"}},
		{"tail-after-replay", []string{"tail", "orders", "--partition", "us"}},
		{"dlq-unknown-queue", []string{"dlq", "list", "nope"}},
		{"pause", []string{"pause", "orders"}},
		{"queues-paused", []string{"queues"}},
		{"resume", []string{"resume", "orders", "--group", "billing"}},
		{"pause-unknown-queue", []string{"pause", "nope", "--group", "billing"}},
		{"maintenance-status", []string{"maintenance", "status"}},
		{"maintenance-on", []string{"maintenance", "on"}},
		{"maintenance-status-on", []string{"maintenance", "status", "--json"}},
		{"maintenance-off", []string{"maintenance", "off"}},
		{"group-list", []string{"group", "list", "orders"}},
		{"group-list-json", []string{"group", "list", "orders", "--json"}},
		{"group-list-unknown", []string{"group", "list", "nope"}},
		{"group-reset-active", []string{"group", "reset", "orders", "--to", "earliest"}},
		{"lease-release", []string{"lease", "release", "orders", "--partition", "eu"}},
		{"lease-release-none-json", []string{"lease", "release", "orders", "--partition", "eu", "--json"}},
		{"lease-unknown-partition", []string{"lease", "release", "orders", "--partition", "zz"}},
		{"group-reset-latest", []string{"group", "reset", "orders", "--to", "latest"}},
		{"group-reset-offsets-json", []string{"group", "reset", "orders", "--offset", "eu=1", "--json"}},
		{"group-reset-new-group", []string{"group", "reset", "orders", "--group", "audit", "--to", "1h", "--partition", "us"}},
		{"group-delete", []string{"group", "delete", "orders", "--group", "audit"}},
		{"group-delete-unknown", []string{"group", "delete", "orders", "--group", "audit"}},
		{"usage-group-to-and-offset", []string{"group", "reset", "orders", "--to", "latest", "--offset", "eu=1"}},
		{"validate", []string{"validate"}},
		{"usage-no-command", []string{}},
		{"usage-unknown-command", []string{"frobnicate"}},
		{"usage-missing-argument", []string{"status"}},
		{"usage-extra-argument", []string{"status", "orders", "more"}},
		{"usage-bad-flag", []string{"tail", "orders", "--limit", "x"}},
		{"usage-bad-time", []string{"dlq", "list", "orders", "--since", "yesterday"}},
		{"usage-bad-subcommand", []string{"maintenance", "maybe"}},
		{"usage-invalid-name", []string{"status", "bad\x01name"}},
		{"help-status", []string{"help", "status"}},
	}
	for _, s := range steps {
		args := s.args
		if !strings.HasPrefix(s.name, "usage-no-command") {
			args = append(append([]string{}, s.args...), db...)
		}
		golden(t, s.name, n, s.args, runCLI(ctx, args...))
	}
	// The replay put us/0 back at the tail as us/2 and left the queue's
	// dead letters empty.
	dls, err := c.Queue("orders").DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after replay: %d, %v", len(dls), err)
	}
	if c.Maintenance() {
		t.Errorf("maintenance still on after \"maintenance off\"")
	}
}

// TestSchemaCommands: validate, migrate-up and the refusal of other
// commands on a schema that is not at this binary's version.
func TestSchemaCommands(t *testing.T) {
	ctx := ctxT(t)
	url, schema := queentest.URL(t), queentest.Schema(t)
	n := normalizer{schema: schema, url: url}
	db := []string{"--database-url", url, "--schema", schema}
	for _, s := range []struct {
		name string
		args []string
	}{
		{"validate-missing", []string{"validate"}},
		{"validate-missing-json", []string{"validate", "--json"}},
		{"status-before-migrate", []string{"status", "orders"}},
		{"migrate-up", []string{"migrate-up"}},
		{"migrate-up-again", []string{"migrate-up", "--json"}},
		{"migrate-up-citus-missing", []string{"migrate-up", "--citus"}},
		{"validate-ok", []string{"validate"}},
		{"queues-none", []string{"queues"}},
		{"queues-none-json", []string{"queues", "--json"}},
	} {
		golden(t, s.name, n, s.args, runCLI(ctx, append(s.args, db...)...))
	}
	// A database migrated further than this binary knows.
	p, code := (&env{ctx: ctx, stderr: os.Stderr, cmd: cmdValidate, o: opts{url: url}}).pool(1)
	if code != exitOK {
		t.Fatal("pool")
	}
	defer p.Close()
	if _, err := p.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.schema_migrations (version, name, checksum) VALUES (%d, 'future', 'x')`,
		schema, sqlschema.Latest()+1)); err != nil {
		t.Fatal(err)
	}
	golden(t, "validate-too-new", n, []string{"validate"}, runCLI(ctx, append([]string{"validate"}, db...)...))
	golden(t, "migrate-up-too-new", n, []string{"migrate-up"}, runCLI(ctx, append([]string{"migrate-up"}, db...)...))
}

// TestNoDatabase: without a URL every database command says how to give
// one; unreachable, it says so.
func TestNoDatabase(t *testing.T) {
	t.Setenv("QUEEN_DATABASE_URL", "")
	ctx := ctxT(t)
	r := runCLI(ctx, "queues")
	if r.code != exitUsage || !strings.Contains(r.stderr, "pass --database-url or set QUEEN_DATABASE_URL") {
		t.Errorf("no URL: %+v", r)
	}
	r = runCLI(ctx, "queues", "--database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if r.code != exitError || !strings.Contains(r.stderr, "cannot reach the database") {
		t.Errorf("unreachable: %+v", r)
	}
	r = runCLI(ctx, "queues", "--database-url", "postgres://x", "--schema", "Bad-Schema")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--schema") {
		t.Errorf("bad schema: %+v", r)
	}
}

// TestMigrateGet: the SQL of the requested migrations, no database needed.
func TestMigrateGet(t *testing.T) {
	ctx := ctxT(t)
	latest := sqlschema.Latest()
	r := runCLI(ctx, "migrate-get", "--schema", "myq")
	// Every migration, then the function layer (one transaction each).
	if r.code != exitOK || strings.Count(r.stdout, "\nBEGIN;\n") != latest+1 || !strings.Contains(r.stdout, `CREATE SCHEMA IF NOT EXISTS "myq"`) ||
		!strings.Contains(r.stdout, "schema_functions") {
		t.Errorf("all migrations: exit %d, %d BEGINs, stderr %q", r.code, strings.Count(r.stdout, "\nBEGIN;\n"), r.stderr)
	}
	want, err := sqlschema.Script("myq", 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if r := runCLI(ctx, "migrate-get", "--schema", "myq", "--version", "2"); r.code != exitOK || r.stdout != want {
		t.Errorf("--version 2: exit %d, output is not Script(1, 2)", r.code)
	}
	if r := runCLI(ctx, "migrate-get", "--schema", "myq", "--from", "1", "--to", "2"); r.code != exitOK || r.stdout != want {
		t.Errorf("--from 1 --to 2: exit %d, output is not Script(1, 2)", r.code)
	}
	for _, bad := range [][]string{
		{"--version", "0", "--to", "2"}, {"--version", "2", "--from", "1"}, {"--from", "3", "--to", "2"},
		{"--to", fmt.Sprint(latest + 1)}, {"--version", "-1"}, {"--version", fmt.Sprint(latest + 1)}, {"--schema", "Bad"},
	} {
		if r := runCLI(ctx, append([]string{"migrate-get"}, bad...)...); r.code != exitUsage || !strings.Contains(r.stderr, "Usage: queen migrate-get") {
			t.Errorf("migrate-get %v: exit %d, stderr %q", bad, r.code, r.stderr)
		}
	}
}

// syncBuffer is written by the command and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTailFollow: --follow prints what is pushed after it started, in new
// partitions too, and exits 0 when interrupted.
func TestTailFollow(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("events")
	push(t, q, queen.Item{Partition: "a", Data: []byte("a0")}, queen.Item{Partition: "a", Data: []byte("a1")})
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"tail", "events", "--follow", "--limit", "1", "--interval", "20ms",
			"--database-url", queentest.URL(t), "--schema", c.Schema()}, &out, &errb)
	}()
	waitFor(t, "the last message", func() bool { return strings.Contains(out.String(), "a  1  -  a1\n") })
	push(t, q, queen.Item{Partition: "a", Data: []byte("a2")}, queen.Item{Partition: "b", Data: []byte("b0")})
	waitFor(t, "the new messages", func() bool {
		s := out.String()
		return strings.Contains(s, "a  2  -  a2\n") && strings.Contains(s, "b  0  -  b0\n")
	})
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d after interrupt, stderr %q", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tail --follow did not stop")
	}
	// One push to two partitions commits per partition (two bundles may
	// land in either order across polls): each partition's lines in order,
	// and nothing else.
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	var a, b []string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "a "):
			a = append(a, l)
		case strings.HasPrefix(l, "b "):
			b = append(b, l)
		}
	}
	if len(lines) != 3 || strings.Join(a, "|") != "a  1  -  a1|a  2  -  a2" || strings.Join(b, "|") != "b  0  -  b0" {
		t.Errorf("output %q, want a1 then a2, and b0 (a0 is older than --limit 1)", out.String())
	}
}

// TestServe: the dashboard answers on the address it prints and stops on
// interrupt.
func TestServe(t *testing.T) {
	c := queentest.Open(t)
	push(t, c.Queue("orders"), queen.Item{Partition: "p", Data: []byte("x")})
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--database-url", queentest.URL(t), "--schema", c.Schema()}, &out, &errb)
	}()
	re := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/) \(read-only\)`)
	waitFor(t, "the address", func() bool { return re.MatchString(out.String()) })
	base := re.FindStringSubmatch(out.String())[1]
	body := httpGet(t, base)
	if !strings.Contains(body, `<a href="queue?name=orders">orders</a>`) {
		t.Errorf("dashboard does not list the queue:\n%s", body)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
	if errb.String() != "" {
		t.Errorf("stderr %q: no warning expected on loopback", errb.String())
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("GET %s: %d, %v", url, res.StatusCode, err)
	}
	return string(b)
}

// TestDLQFilters: list pages with --after; replay honours --partition,
// --group, --since, --until and --limit, and --dry-run changes nothing.
func TestDLQFilters(t *testing.T) {
	c := queentest.Open(t)
	ctx := ctxT(t)
	q := c.Queue("jobs")
	if err := q.Configure(ctx, queen.QueueOptions{DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	// a: 2 dead letters of queue mode, 1 of group g1; b: 1 of queue mode.
	push(t, q, queen.Item{Partition: "a", Data: []byte("a0")}, queen.Item{Partition: "a", Data: []byte("a1")})
	push(t, q, queen.Item{Partition: "b", Data: []byte("b0")})
	kill := func(o queen.PopOptions) {
		for _, m := range pop(t, q, o) {
			if err := m.DeadLetter(ctx, errors.New("no")); err != nil {
				t.Fatal(err)
			}
		}
	}
	kill(queen.PopOptions{Partition: "a", Batch: 1})
	kill(queen.PopOptions{Partition: "a", Batch: 1})
	kill(queen.PopOptions{Partition: "a", Batch: 1, Group: "g1"})
	kill(queen.PopOptions{Partition: "b", Batch: 1})
	db := []string{"--database-url", queentest.URL(t), "--schema", c.Schema()}
	cli := func(args ...string) result { return runCLI(ctx, append(args, db...)...) }
	count := func() int {
		dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
		if err != nil {
			t.Fatal(err)
		}
		return len(dls)
	}

	r := cli("dlq", "list", "jobs", "--limit", "1")
	if r.code != exitOK || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stderr, "add --after 1 for the next page") {
		t.Errorf("list --limit 1: %+v", r)
	}
	if r := cli("dlq", "list", "jobs", "--after", "3"); r.code != exitOK || strings.Count(r.stdout, "\n") != 2 || r.stderr != "" {
		t.Errorf("list --after 3: %+v", r)
	}
	if r := cli("dlq", "list", "jobs", "--group", "g1", "--group", ""); r.code != exitOK || strings.Count(r.stdout, "\n") != 5 {
		t.Errorf("list with both groups: %+v", r)
	}
	if r := cli("dlq", "replay", "jobs", "--partition", "a", "--dry-run"); r.code != exitOK ||
		!strings.HasSuffix(r.stdout, "would replay the 3 dead letters of queue \"jobs\" listed above (dry run, nothing changed)\n") || count() != 4 {
		t.Errorf("dry run: %+v, %d left", r, count())
	}
	if r := cli("dlq", "replay", "jobs", "--until", "1h"); r.code != exitOK || !strings.HasPrefix(r.stdout, "nothing to replay") || count() != 4 {
		t.Errorf("--until 1h ago: %+v, %d left", r, count())
	}
	if r := cli("dlq", "replay", "jobs", "--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)); r.code != exitOK ||
		!strings.HasPrefix(r.stdout, "nothing to replay") {
		t.Errorf("--since in an hour: %+v", r)
	}
	if r := cli("dlq", "replay", "jobs", "--group", "g1", "--json"); r.code != exitOK || !strings.Contains(r.stdout, `"replayed": 1`) || count() != 3 {
		t.Errorf("replay g1: %+v, %d left", r, count())
	}
	if r := cli("dlq", "replay", "jobs", "--partition", "a", "--limit", "1", "--since", "1h"); r.code != exitOK ||
		!strings.HasPrefix(r.stdout, "replayed 1 message") || count() != 2 {
		t.Errorf("replay a --limit 1: %+v, %d left", r, count())
	}
	if r := cli("dlq", "replay", "jobs"); r.code != exitOK || !strings.HasPrefix(r.stdout, "replayed 2 messages") || count() != 0 {
		t.Errorf("replay the rest: %+v, %d left", r, count())
	}
	// discard: the same filters, and --id.
	kill(queen.PopOptions{Partition: "a", Batch: 1, Group: "g2"})
	kill(queen.PopOptions{Partition: "a", Batch: 1, Group: "g2"})
	kill(queen.PopOptions{Partition: "b", Batch: 1, Group: "g2"})
	dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(dls) != 3 {
		t.Fatalf("dead letters for discard: %d, %v", len(dls), err)
	}
	before, err := q.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r := cli("dlq", "discard", "jobs", "--partition", "a", "--dry-run"); r.code != exitOK ||
		!strings.HasSuffix(r.stdout, "would discard the 2 dead letters of queue \"jobs\" listed above (dry run, nothing changed)\n") || count() != 3 {
		t.Errorf("discard dry run: %+v, %d left", r, count())
	}
	id := strconv.FormatInt(dls[1].ID, 10)
	if r := cli("dlq", "discard", "jobs", "--id", id); r.code != exitOK || r.stdout != "discarded 1 dead letter of queue \"jobs\"\n" || count() != 2 {
		t.Errorf("discard --id %s: %+v, %d left", id, r, count())
	}
	if r := cli("dlq", "discard", "jobs", "--id", id, "--json"); r.code != exitOK || !strings.Contains(r.stdout, `"discarded": 0`) {
		t.Errorf("discard --id %s again: %+v", id, r)
	}
	if r := cli("dlq", "discard", "jobs", "--partition", "b", "--json"); r.code != exitOK || !strings.Contains(r.stdout, `"discarded": 1`) || count() != 1 {
		t.Errorf("discard b: %+v, %d left", r, count())
	}
	if left, _ := q.DeadLetters(ctx, queen.DeadLetterQuery{}); len(left) != 1 || left[0].ID != dls[0].ID {
		t.Errorf("left after the discards: %+v, want only %d", left, dls[0].ID)
	}
	after, err := q.Status(ctx)
	if err != nil || len(after.Partitions) != len(before.Partitions) {
		t.Fatalf("status after the discards: %+v, %v", after, err)
	}
	for i, p := range after.Partitions {
		if p.LastOffset != before.Partitions[i].LastOffset {
			t.Errorf("discard pushed to %s: last offset %d, was %d", p.Name, p.LastOffset, before.Partitions[i].LastOffset)
		}
	}
	for _, bad := range [][]string{
		{"dlq", "replay", "jobs", "--after", "1"}, {"dlq", "discard", "jobs", "--after", "1"}, {"dlq", "discard", "jobs", "--id", "0"},
		{"dlq", "list", "jobs", "--dry-run"}, {"dlq", "list", "jobs", "--limit", "10001"},
		{"dlq", "purge", "jobs"}, {"dlq"}, {"dlq", "list", "jobs", "--partition", "bad\x00"}, {"dlq", "list", "jobs", "--until", "-1h"},
	} {
		if r := cli(bad...); r.code != exitUsage {
			t.Errorf("%q: exit %d, want 2: %s", bad, r.code, r.stderr)
		}
	}
}

// leaked reports the first piece (3 bytes or more) of secret found in s.
func leaked(s, secret string) string {
	for i := 0; i+3 <= len(secret); i++ {
		if strings.Contains(s, secret[i:i+3]) {
			return secret[i : i+3]
		}
	}
	return ""
}

// TestURLNeverShown: a database URL that does not parse, or parses into a
// host or database name holding part of the password (an '@' or '/' not
// percent-encoded), is refused with what is wrong and no part of it, from
// the flag or the environment; an unreachable one shows no password either.
func TestURLNeverShown(t *testing.T) {
	ctx := ctxT(t)
	for _, tc := range []struct {
		url, password, want string
		code                int
	}{
		{"postgres://alice:S3cr@tPW@localhost:badport/db", "S3cr@tPW", "invalid port", exitUsage},
		{"postgres://alice:S3cr@tPW@localhost/db?sslmode=bogus", "S3cr@tPW", "sslmode", exitUsage},
		{"postgres://alice:S3cr%40tPW@localhost/db?sslmode=bogus", "S3cr%40tPW", "unknown sslmode", exitUsage},
		{"postgres://alice:S3cr%tPW@localhost/db", "S3cr%tPW", "URL", exitUsage},
		{"postgres://alice:S3cr@t PW@localhost/db", "S3cr@t PW", "URL", exitUsage},
		{"alice:S3cr@tPW@localhost/db", "S3cr@tPW", "", exitUsage},
		{"host=localhost password=S3cr3t Pa55 port=5432", "S3cr3t Pa55", "", exitUsage},
		{"postgres://alice:S3cr@tPW@127.0.0.1:1/db?connect_timeout=2", "S3cr@tPW", "@", exitUsage},
		{"postgres://alice:12/34tPW@127.0.0.1:1/db?connect_timeout=2", "12/34tPW", "@", exitUsage},
		{"postgres://alice:S3cr%40tPW@127.0.0.1:1/db?connect_timeout=2", "S3cr%40tPW", "cannot reach the database", exitError},
	} {
		for _, env := range []bool{false, true} {
			var r result
			if env {
				t.Setenv("QUEEN_DATABASE_URL", tc.url)
				r = runCLI(ctx, "queues")
			} else {
				t.Setenv("QUEEN_DATABASE_URL", "")
				r = runCLI(ctx, "queues", "--database-url", tc.url)
			}
			if p := leaked(r.stdout+r.stderr, tc.password); p != "" {
				t.Errorf("%q (env %v): the output shows %q of the password:\n%s%s", tc.url, env, p, r.stdout, r.stderr)
			}
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%q (env %v): exit %d, stderr %q; want exit %d saying %q", tc.url, env, r.code, r.stderr, tc.code, tc.want)
			}
		}
	}
}

// TestURLArgumentNeverShown: a database URL given where a command, an
// argument or a queue name goes (the flag name forgotten) is not echoed
// back in the error.
func TestURLArgumentNeverShown(t *testing.T) {
	ctx := ctxT(t)
	const secret = "postgres://alice:S3cr@tPW@localhost/db"
	c := queentest.Open(t)
	db := []string{"--database-url", queentest.URL(t), "--schema", c.Schema()}
	for _, args := range [][]string{
		{secret, "queues"},
		{"help", secret},
		{"queues", secret},
		{"dlq", secret},
		{"maintenance", secret},
		append([]string{"status", secret}, db...),
		append([]string{"status", "postgresql://bob:pa55word@localhost/db"}, db...),
	} {
		r := runCLI(ctx, args...)
		// The schema's name is random hex and may hold a piece of a
		// password ("a55"); the output is allowed to name it.
		out := strings.ReplaceAll(r.stdout+r.stderr, c.Schema(), "<schema>")
		if p := leaked(out, "S3cr@tPW"); p != "" {
			t.Errorf("%q: the output shows %q of the password:\n%s%s", args, p, r.stdout, r.stderr)
		}
		if p := leaked(out, "pa55word"); p != "" {
			t.Errorf("%q: the output shows %q of the password:\n%s%s", args, p, r.stdout, r.stderr)
		}
		if r.code == exitOK {
			t.Errorf("%q: exit 0", args)
		}
	}
}

// TestDLQReplayIsBounded: a consumer that dead-letters every replayed
// message at once (here a trigger, in the replay's own transaction) does
// not keep "queen dlq replay" going: it replays the dead letters there were
// when it started, once each.
func TestDLQReplayIsBounded(t *testing.T) {
	c := queentest.Open(t)
	ctx := ctxT(t)
	q := c.Queue("jobs")
	if err := q.Configure(ctx, queen.QueueOptions{DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Partition: "a", Data: []byte("a0")}, queen.Item{Partition: "a", Data: []byte("a1")},
		queen.Item{Partition: "a", Data: []byte("a2")})
	for _, m := range pop(t, q, queen.PopOptions{Partition: "a", Batch: 3}) {
		if err := m.DeadLetter(ctx, errors.New("no")); err != nil {
			t.Fatal(err)
		}
	}
	dl := c.Schema() + ".dead_letters"
	if _, err := c.Pool().Exec(ctx, `CREATE FUNCTION `+c.Schema()+`.dead_letter_again() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO `+dl+` (queue_id, partition_id, partition_name, group_name, msg_offset, message_id, transaction_id,
        message_key, message_headers, flags, payload, message_created_at, attempts, reason)
    VALUES (OLD.queue_id, OLD.partition_id, OLD.partition_name, OLD.group_name, OLD.msg_offset, OLD.message_id,
        OLD.transaction_id, OLD.message_key, OLD.message_headers, OLD.flags, OLD.payload, OLD.message_created_at,
        OLD.attempts, 'again');
    RETURN NULL;
END $$;
CREATE TRIGGER dead_letter_again AFTER DELETE ON `+dl+` FOR EACH ROW EXECUTE FUNCTION `+c.Schema()+`.dead_letter_again()`); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r := runCLI(rctx, "dlq", "replay", "jobs", "--database-url", queentest.URL(t), "--schema", c.Schema())
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "replayed 3 messages") {
		t.Fatalf("replay: %+v; want 3 replayed", r)
	}
	dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(dls) != 3 {
		t.Fatalf("dead letters after the replay: %d, %v; want the 3 new ones", len(dls), err)
	}
}
