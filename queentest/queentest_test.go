package queentest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest"
)

// envNoMain makes TestMain run the tests without queentest.Main, for
// TestWithoutMainLeavesNothing's child process.
const envNoMain = "QUEENTEST_TEST_NO_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envNoMain) == "1" {
		os.Exit(m.Run())
	}
	queentest.Main(m)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func schemaExists(t *testing.T, name string) bool {
	t.Helper()
	conn, err := pgx.Connect(ctxT(t), queentest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var ok bool
	if err := conn.QueryRow(ctxT(t), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// Open gives each call its own migrated schema, closes the client and drops
// the schema when the test ends.
func TestOpenSchemaLifecycle(t *testing.T) {
	var c1, c2 *queen.Client
	t.Run("open", func(t *testing.T) {
		c1, c2 = queentest.Open(t), queentest.Open(t)
		if c1.Schema() == c2.Schema() {
			t.Fatalf("two Opens share schema %q", c1.Schema())
		}
		if !schemaExists(t, c1.Schema()) {
			t.Fatalf("schema %q not created", c1.Schema())
		}
		if _, err := c1.Queue("q").Push(ctxT(t), []queen.Item{{Data: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		queentest.RequirePushed(ctxT(t), t, c1.Queue("q"), queentest.Expected{Data: []byte("x")})
		queentest.RequirePushed(ctxT(t), t, c2.Queue("q"))
	})
	for _, c := range []*queen.Client{c1, c2} {
		if schemaExists(t, c.Schema()) {
			t.Errorf("schema %q still exists after its test ended", c.Schema())
		}
		if _, err := c.Queue("q").Push(ctxT(t), []queen.Item{{Data: []byte("y")}}); !errors.Is(err, queen.ErrClosed) {
			t.Errorf("Push after the test ended = %v, want ErrClosed", err)
		}
	}
}

// Under Main the test binary shares one database.
func TestURLShared(t *testing.T) {
	var inner string
	t.Run("a", func(t *testing.T) { inner = queentest.URL(t) })
	if u := queentest.URL(t); u != inner || !strings.HasPrefix(u, "postgres") {
		t.Fatalf("URL = %q in one test, %q in another", inner, u)
	}
}

func TestOpenWithConfig(t *testing.T) {
	tenant := uuid.Must(uuid.NewV4())
	c := queentest.Open(t, queentest.WithConfig(func(cfg *queen.Config) {
		cfg.Tenant = tenant
		cfg.EncryptionKey = bytes.Repeat([]byte{1}, 32)
	}))
	if c.Tenant() != tenant {
		t.Fatalf("Tenant = %v, want %v from WithConfig", c.Tenant(), tenant)
	}
	q := c.Queue("secret")
	if err := q.Configure(ctxT(t), queen.QueueOptions{Encryption: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Push(ctxT(t), []queen.Item{{Partition: "p", Data: []byte("hidden")}}); err != nil {
		t.Fatalf("Push to an encrypted queue: %v (EncryptionKey not applied?)", err)
	}
	queentest.RequirePushed(ctxT(t), t, q, queentest.Expected{Partition: "p", Data: []byte("hidden")})
}

// recorder stands in for a test so a helper's failure can be observed:
// FailNow-style calls end the goroutine, as in a real test.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msg    string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

// run calls f with a recorder for t in its own goroutine and reports
// whether it failed, and its message.
func run(t *testing.T, f func(tb testing.TB)) (bool, string) {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed, r.msg
}

func pushed(t *testing.T, q *queen.Queue, items ...queen.Item) {
	t.Helper()
	if _, err := q.Push(ctxT(t), items); err != nil {
		t.Fatal(err)
	}
}

func TestRequirePushed(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	pushed(t, q,
		queen.Item{Partition: "b", TransactionID: "t1", Key: "k", Headers: map[string]string{"h": "1"}, Data: []byte("one")},
		queen.Item{Partition: "b", TransactionID: "t2", Data: []byte("two")},
		queen.Item{Partition: "a", TransactionID: "t3", Data: []byte{}},
	)
	// Compared per partition: b's expectations may come before a's, and
	// interleave with them. Zero fields other than Partition match anything.
	all := []queentest.Expected{
		{Partition: "b", TransactionID: "t1", Key: "k", Headers: map[string]string{"h": "1"}, Data: []byte("one")},
		{Partition: "a", TransactionID: "t3", Data: []byte{}, Headers: map[string]string{}},
		{Partition: "b", Data: []byte("two")},
	}
	queentest.RequirePushed(ctxT(t), t, q, all...)
	queentest.RequirePushed(ctxT(t), t, q, all[1], all[0], all[2])
	queentest.RequirePushed(ctxT(t), t, q, queentest.Expected{Partition: "a"}, queentest.Expected{Partition: "b"}, queentest.Expected{Partition: "b"})

	for _, tc := range []struct {
		name   string
		expect []queentest.Expected
		want   []string // in the failure message
	}{
		{"wrong data", []queentest.Expected{all[0], all[1], {Partition: "b", Data: []byte("TWO")}},
			[]string{`queue "orders" does not hold the expected messages (3 expected)`, `#2 differs:  offset 1 txn "t2" data "two"`, `data: got "two", want "TWO"`, `#0 ok:`, `#1 ok:`}},
		{"wrong fields", []queentest.Expected{{Partition: "a", Key: "k", TransactionID: "t9"}, all[0], all[2]},
			[]string{`key: got "", want "k"`, `transaction id: got "t3", want "t9"`}},
		{"wrong headers", []queentest.Expected{all[0], all[1], {Partition: "b", Headers: map[string]string{"h": "2"}}},
			[]string{`headers: got {}, want {"h": "2"}`}},
		{"headers where none", []queentest.Expected{{Partition: "a", Headers: map[string]string{"h": "1"}}, all[0], all[2]},
			[]string{`headers: got {}, want {"h": "1"}`}},
		{"missing", append(slices.Clone(all), queentest.Expected{Partition: "a", TransactionID: "t4"}),
			[]string{`(4 expected)`, `partition "a":`, `#3 missing:  txn "t4"`}},
		{"unexpected", all[:2],
			[]string{`(2 expected)`, `partition "b":`, `unexpected:  offset 1 txn "t2" data "two"`}},
		{"unexpected partition", all[1:2],
			[]string{`partition "b":`, `unexpected:  offset 0 txn "t1"`}},
		{"order within a partition", []queentest.Expected{all[2], all[1], all[0]},
			[]string{`#2 differs:  offset 1`, `#0 differs:  offset 0`}},
		{"default partition", []queentest.Expected{{}, {}, {}},
			[]string{`partition "` + queen.DefaultPartition + `":`, `#0 missing:  any message`, `partition "a":`, `unexpected:  offset 0 txn "t3"`}},
		{"empty", nil, []string{`(0 expected)`, `unexpected:`}},
	} {
		failed, msg := run(t, func(tb testing.TB) { queentest.RequirePushed(ctxT(t), tb, q, tc.expect...) })
		if !failed {
			t.Errorf("%s: RequirePushed passed", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: failure message lacks %q:\n%s", tc.name, w, msg)
			}
		}
	}

	// Reading consumed nothing: a pop still starts at a partition's first
	// message, on its first attempt.
	r := queentest.Work(ctxT(t), t, q, func(context.Context, *queen.Message) error { return nil })
	if r.Outcome != queentest.Acked || r.Message.Offset != 0 || r.Message.Attempt != 1 {
		t.Fatalf("Work after RequirePushed = %v %+v, want offset 0 acked on attempt 1", r.Outcome, r.Message)
	}
	// Consumed messages are still retained, so still listed.
	queentest.RequirePushed(ctxT(t), t, q, all...)
}

func TestRequirePushedBadQueue(t *testing.T) {
	c := queentest.Open(t)
	failed, msg := run(t, func(tb testing.TB) { queentest.RequirePushed(ctxT(t), tb, c.Queue("")) })
	if !failed || !strings.Contains(msg, "invalid name") {
		t.Fatalf("RequirePushed on an invalid queue name: failed %v, %q", failed, msg)
	}
}

func TestWork(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("jobs")
	if err := q.Configure(ctxT(t), queen.QueueOptions{RetryLimit: 2, DeadLetter: true,
		RetryBackoff: queen.RetryBackoff{Disabled: true}}); err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, *queen.Message) error { return nil }
	if r := queentest.Work(ctxT(t), t, q, ok); r.Outcome != queentest.Empty || r.Message != nil || r.Err != nil {
		t.Fatalf("Work on an empty queue = %+v, want Empty", r)
	}
	pushed(t, q, queen.Item{Partition: "p", Data: []byte("a")}, queen.Item{Partition: "p", Data: []byte("b")})

	boom := errors.New("boom")
	r := queentest.Work(ctxT(t), t, q, func(_ context.Context, m *queen.Message) error {
		if string(m.Data) != "a" {
			t.Errorf("handler got %q, want a", m.Data)
		}
		return boom
	})
	if r.Outcome != queentest.Failed || !errors.Is(r.Err, boom) || r.Panic != nil || string(r.Message.Data) != "a" {
		t.Fatalf("Work with a failing handler = %+v, want Failed with boom", r)
	}
	// Failed, not acked: it comes back, charged one attempt.
	r = queentest.Work(ctxT(t), t, q, func(context.Context, *queen.Message) error { panic("kaboom") })
	if r.Outcome != queentest.Panicked || r.Panic != "kaboom" || !errors.Is(r.Err, queen.ErrPanic) ||
		!strings.Contains(r.Err.Error(), "kaboom") || r.Message.Attempt != 2 || string(r.Message.Data) != "a" {
		t.Fatalf("Work with a panicking handler = %+v (attempt %d), want Panicked, ErrPanic, attempt 2 of a", r, r.Message.Attempt)
	}
	// The panic spent the retry budget: dead-lettered with its reason, as
	// Consume would.
	dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dls) != 1 || string(dls[0].Data) != "a" || !strings.Contains(dls[0].Reason, "handler panicked: kaboom") {
		t.Fatalf("dead letters %+v, %v; want a, failed by the panic", dls, err)
	}
	r = queentest.Work(ctxT(t), t, q, ok)
	if r.Outcome != queentest.Acked || r.Err != nil || string(r.Message.Data) != "b" {
		t.Fatalf("Work with a succeeding handler = %+v, want b acked", r)
	}
	if r := queentest.Work(ctxT(t), t, q, ok); r.Outcome != queentest.Empty {
		t.Fatalf("Work after the last ack = %+v, want Empty", r)
	}
	for o, s := range map[queentest.Outcome]string{queentest.Empty: "empty", queentest.Acked: "acked",
		queentest.Failed: "failed", queentest.Panicked: "panicked", 9: "Outcome(9)"} {
		if o.String() != s {
			t.Errorf("Outcome %d String = %q, want %q", int(o), o.String(), s)
		}
	}
}

// Work fails the test when its pop fails.
func TestWorkPopError(t *testing.T) {
	c := queentest.Open(t)
	failed, msg := run(t, func(tb testing.TB) {
		queentest.Work(ctxT(t), tb, c.Queue(""), func(context.Context, *queen.Message) error { return nil })
	})
	if !failed || !strings.Contains(msg, "invalid name") {
		t.Fatalf("Work on an invalid queue name: failed %v, %q", failed, msg)
	}
}

// Without Main, a test gets a cluster of its own, removed when it ends:
// the child test binary (this one, without Main) reports the cluster's data
// directory, which must be gone once it exits.
func TestWithoutMainLeavesNothing(t *testing.T) {
	if os.Getenv(envNoMain) == "1" {
		t.Skip("child process")
	}
	if os.Getenv(queentest.EnvURL) != "" {
		t.Skipf("%s is set: no cluster is started", queentest.EnvURL)
	}
	queentest.URL(t) // skips (fails on CI) without PostgreSQL
	ctx := ctxT(t)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChildReportsDataDir$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envNoMain+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var dirs []string
	for _, l := range strings.Split(string(out), "\n") {
		if _, d, ok := strings.Cut(l, "DATADIR="); ok {
			dirs = append(dirs, strings.TrimSpace(d))
		}
	}
	if len(dirs) != 2 || dirs[0] == dirs[1] {
		t.Fatalf("child reported data directories %q, want two distinct ones (a cluster per test):\n%s", dirs, out)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("data directory %s left behind (stat: %v)", d, err)
		}
	}
}

// TestChildReportsDataDir runs only in TestWithoutMainLeavesNothing's
// child: two subtests each open a client and print their cluster's data
// directory.
func TestChildReportsDataDir(t *testing.T) {
	if os.Getenv(envNoMain) != "1" {
		t.Skip("runs only as TestWithoutMainLeavesNothing's child")
	}
	for _, name := range []string{"first", "second"} {
		t.Run(name, func(t *testing.T) {
			c := queentest.Open(t)
			if first, again := queentest.URL(t), queentest.URL(t); first != again {
				t.Fatal("URL differs within one test")
			}
			var dir string
			if err := c.Pool().QueryRow(ctxT(t), "SHOW data_directory").Scan(&dir); err != nil {
				t.Fatal(err)
			}
			fmt.Printf("DATADIR=%s\n", dir)
		})
	}
}

// WorkWith pops as a named group, which reads the queue on its own cursor,
// and on one partition.
func TestWorkWithGroup(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("events")
	pushed(t, q, queen.Item{Partition: "p", Data: []byte("a")}, queen.Item{Partition: "r", Data: []byte("b")})
	ok := func(context.Context, *queen.Message) error { return nil }
	if r := queentest.Work(ctxT(t), t, q, ok); r.Outcome != queentest.Acked {
		t.Fatalf("queue-mode Work = %+v, want acked", r)
	}
	r := queentest.WorkWith(ctxT(t), t, q, queentest.WorkOptions{Group: "audit", Partition: "r"}, ok)
	if r.Outcome != queentest.Acked || string(r.Message.Data) != "b" || r.Message.Group != "audit" {
		t.Fatalf("Work as group audit on r = %+v, want b acked by audit", r)
	}
	// The group's own cursor: queue mode's ack of one message did not
	// consume it for the group.
	seen := map[string]bool{}
	for {
		r := queentest.WorkWith(ctxT(t), t, q, queentest.WorkOptions{Group: "audit"}, ok)
		if r.Outcome == queentest.Empty {
			break
		}
		seen[string(r.Message.Data)] = true
	}
	if !seen["a"] || seen["b"] || len(seen) != 1 {
		t.Fatalf("group audit then got %v, want just a", seen)
	}
}
