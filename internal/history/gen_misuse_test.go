package history_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
	"github.com/e03140bc/queen/spool"
)

// The "misuse" generator: public calls made the way a careless user makes
// them, none of which a history of normal traffic shows. Each worker of
// the test process makes them once per seed, at a random moment in the
// first 60% of the run: settles of nil and zero messages, Open with a
// database URL that does not parse (a password in it), and Configure with
// a sub-millisecond LeaseTime. The workers of main-0 also make one call
// each that needs a client of its own (a spool directory Open must refuse;
// Open against a server that never answers; Close with a short deadline
// while a handler runs on), so a seed costs two extra Opens of the
// database. Odd seeds also run on a schema of the longest valid name (63
// bytes), whose NOTIFY channel must still fit PostgreSQL's identifiers.

// misuser schedules one worker's misuse calls; nil when "misuse" is off or
// the worker is not one of the test process's main clients.
type misuser struct {
	w         *worker
	at        time.Time
	rng       *rand.Rand
	expensive bool // long enough a run for the calls that open a client
}

func (w *worker) misuser(ctx context.Context) *misuser {
	if !w.gen["misuse"] || w.other == nil {
		return nil
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s.%d", w.proc, w.idx)
	// A stream of its own: the worker's draws stay as they were.
	rng := rand.New(rand.NewPCG(w.r.seed, h.Sum64()))
	left := time.Until(deadlineOf(ctx))
	return &misuser{w: w, rng: rng, at: time.Now().Add(time.Duration(rng.Float64() * 0.6 * float64(left))), expensive: left > 3*time.Second}
}

// maybe makes the calls once their moment came.
func (m *misuser) maybe(ctx context.Context) {
	if m == nil || m.at.IsZero() || time.Now().Before(m.at) {
		return
	}
	m.at = time.Time{}
	// The run's end must not cut them short: their outcome is the point.
	ctx = context.WithoutCancel(ctx)
	w := m.w
	w.nilSettles(ctx)
	for range 3 {
		w.badURL(ctx, m.rng)
	}
	w.subMsLease(ctx, m.rng)
	w.undescribedURL(ctx)
	if !m.expensive || w.proc != "main-0" {
		return
	}
	switch w.idx {
	case 0:
		w.unsafeSpool(ctx, m.rng)
	case 1:
		w.deadServer(ctx)
	case 2:
		w.closeLate(ctx)
	}
}

// longSchema pads an odd seed's schema name to 63 bytes, the longest
// PostgreSQL takes: "queen_" and it no longer fit a NOTIFY channel.
func longSchema(schema string, seed uint64) string {
	if seed%2 == 0 || len(schema) >= 63 {
		return schema
	}
	return schema + "_" + strings.Repeat("l", 62-len(schema))
}

var quiet = slog.New(slog.DiscardHandler)

// protect runs f, turning a panic into an error with history.PanicPrefix.
func protect(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s%v", history.PanicPrefix, p)
		}
	}()
	return f()
}

// nilSettles settles a nil and a zero message every way there is: each must
// return ErrUnknownMessage, none may panic.
func (w *worker) nilSettles(ctx context.Context) {
	for _, m := range []*queen.Message{nil, {}} {
		what := "nil"
		if m != nil {
			what = "zero"
		}
		for _, call := range []struct {
			kind string
			f    func() error
		}{
			{"ack", func() error { return m.Ack(ctx) }},
			{"fail", func() error { return m.Fail(ctx, errors.New("history: misuse")) }},
			{"retry", func() error { return m.Retry(ctx) }},
			{"dead", func() error { return m.DeadLetter(ctx, errors.New("history: misuse")) }},
			{"extend", func() error { return m.ExtendLease(ctx, time.Second) }},
			{"ackbatch", func() error {
				errs, err := w.c.Queue(queueSpecs[0].name).AckBatch(ctx, []queen.AckRequest{{Message: m, Status: queen.AckSuccess}})
				if err == nil && len(errs) == 1 {
					err = errs[0]
				}
				return err
			}},
		} {
			inv := w.call("", "", call.kind+"-"+what, true)
			w.done(inv, protect(call.f), queen.ErrUnknownMessage)
		}
	}
}

// urlTemplates are database URLs that do not parse (or parse with part of
// the password as the host), after the library's own parser test; %s is
// the password, of two parts joined by sep.
var urlTemplates = []struct{ f, sep string }{
	{"postgres://alice:%s@localhost:badport/db", "@"},
	{"postgres://alice:%s@localhost/db?sslmode=bogus", "@"},
	{"postgres://alice:%s@localhost/db", "%"},
	{"postgres://alice:%s@localhost/db", " "},
	{"postgres://alice:%s@[::1/db", "@"},
	{"postgres://alice:%s@localhost/db?connect_timeout=x", "@"},
	{"postgres://alice:%s@localhost/db?%%zz=1", "@"},
	{"alice:%s@localhost/db", "@"},
	{"host=127.0.0.1 password=%s port=5432", " "},
	{"host=127.0.0.1 password='%s port=5432", " "},
	{"host=127.0.0.1 password=%s port=bad", "-"},
	// Parsed by a lenient parser: the host would be "<part>@127.0.0.1".
	{"postgres://alice:%s@127.0.0.1:1/db", "@"},
}

func randWord(rng *rand.Rand, n int) string {
	const abc = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = abc[rng.IntN(len(abc))]
	}
	return string(b)
}

// badURL opens a client with a URL that does not parse: Open must fail,
// and its error must not show the password.
func (w *worker) badURL(ctx context.Context, rng *rand.Rand) {
	t := urlTemplates[rng.IntN(len(urlTemplates))]
	pw := randWord(rng, 6) + t.sep + randWord(rng, 6)
	cfg := queen.Config{DatabaseURL: fmt.Sprintf(t.f, pw), Schema: w.r.schema, StatementTimeout: statementTimeout, Logger: quiet,
		SpoolDir: filepath.Join(os.TempDir(), "queen-misuse-never-made")}
	inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "open-url", Invalid: true, Secret: pw})
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := queen.Open(octx, cfg)
	if err == nil {
		w.rec.Done(inv, history.OK, history.Event{})
		_ = c.Close(octx)
		return
	}
	// Any error refuses it: the check is what the error shows.
	w.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
}

// undescribedURL opens a client on the run's database with connections
// that do not describe statements (pgx's exec or simple_protocol mode):
// Open must refuse it, as a push there could not be sent.
func (w *worker) undescribedURL(ctx context.Context) {
	mode := [2]string{"exec", "simple_protocol"}[w.idx%2]
	u, err := url.Parse(w.r.url())
	if err != nil {
		return
	}
	qv := u.Query()
	qv.Set("default_query_exec_mode", mode)
	u.RawQuery = qv.Encode()
	cfg := queen.Config{DatabaseURL: u.String(), Schema: w.r.schema, StatementTimeout: statementTimeout, Logger: quiet,
		SpoolDir: filepath.Join(os.TempDir(), "queen-misuse-never-made")}
	inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "open-" + mode, Invalid: true})
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := queen.Open(octx, cfg)
	if err == nil {
		w.rec.Done(inv, history.OK, history.Event{})
		_ = c.Close(octx)
		return
	}
	// Refused, or the database did not answer: not accepted either way.
	w.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
}

// subMsLease configures a fresh queue with a LeaseTime under the 1ms it is
// stored in: Configure must refuse it (stored as 0, every pop would take
// the partition from its holder).
func (w *worker) subMsLease(ctx context.Context, rng *rand.Rand) {
	q := fmt.Sprintf("misuse-lease-%s.%d", w.proc, w.idx)
	lt := time.Duration(1+rng.IntN(999)) * time.Microsecond
	inv := w.call(q, "", "configure-lease-"+lt.String(), true)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.c.Queue(q).Configure(cctx, queen.QueueOptions{LeaseTime: lt}); err != nil {
		// Refused, or the database did not answer: not accepted either way.
		w.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
		return
	}
	w.rec.Done(inv, history.OK, history.Event{})
}

// unsafeSpool opens a client on a spool directory others could write to
// or that another user owns: Open must refuse it (spool.ErrUnsafeDir).
func (w *worker) unsafeSpool(ctx context.Context, rng *rand.Rand) {
	base, err := os.MkdirTemp("", "queen-misuse-")
	if err != nil {
		return
	}
	defer os.RemoveAll(base)
	dir := filepath.Join(base, "spool")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return
	}
	kind := []string{"world-writable", "group-writable", "symlink to world-writable", "owned by another user"}[rng.IntN(4)]
	if kind == "owned by another user" && os.Geteuid() != 0 {
		kind = "world-writable" // only root can give it away
	}
	switch kind {
	case "world-writable":
		err = os.Chmod(dir, 0o777)
	case "group-writable":
		err = os.Chmod(dir, 0o770)
	case "symlink to world-writable":
		if err = os.Chmod(dir, 0o777); err == nil {
			link := filepath.Join(base, "link")
			err = os.Symlink(dir, link)
			dir = link
		}
	case "owned by another user":
		err = os.Chown(dir, 4242, 4242)
	}
	if err != nil {
		return
	}
	cfg := w.r.config("misuse-spool", dir)
	cfg.Logger = quiet
	inv := w.call("", "", "open-spool-"+strings.ReplaceAll(kind, " ", "-"), true)
	var last error
	for range 3 {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		c, err := queen.Open(octx, cfg)
		cancel()
		if err == nil {
			w.rec.Done(inv, history.OK, history.Event{})
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_ = c.Close(cctx)
			cancel()
			return
		}
		if errors.Is(err, spool.ErrUnsafeDir) {
			w.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
			return
		}
		last = err // the database did not answer before the spool was opened
		time.Sleep(time.Second)
	}
	w.rec.Done(inv, history.Fail, history.Event{Err: "unanswered: " + last.Error()})
}

// deadServer opens a client on an address that accepts connections and
// never answers: with StatementTimeout 1s, which bounds connecting, Open
// must fail within it.
func (w *worker) deadServer(ctx context.Context) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return
	}
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	u, err := url.Parse(w.r.url())
	if err != nil {
		return
	}
	u.Host = ln.Addr().String()
	cfg := w.r.config("misuse-dead", filepath.Join(os.TempDir(), "queen-misuse-never-made"))
	cfg.DatabaseURL, cfg.StatementTimeout, cfg.Logger = u.String(), time.Second, quiet
	start := time.Now()
	inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "open", Deadline: start.Add(cfg.StatementTimeout).UnixNano()})
	// Far past the bound: a connect that ignores it ends here.
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c, err := queen.Open(octx, cfg)
	if err == nil {
		w.rec.Done(inv, history.OK, history.Event{})
		_ = c.Close(octx)
		return
	}
	w.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
}

// closeLate closes a client with a 1s context while its Consume handler
// runs on (a SoftStop of 20s it keeps): Close must return by the deadline
// and leave the shutdown to the background.
func (w *worker) closeLate(ctx context.Context) {
	dir, err := os.MkdirTemp("", "queen-misuse-")
	if err != nil {
		return
	}
	defer os.RemoveAll(dir)
	cfg := w.r.config("misuse-close", dir)
	cfg.Logger = quiet
	var c *queen.Client
	for range 3 {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		c, err = queen.Open(octx, cfg)
		cancel()
		if err == nil {
			break
		}
		time.Sleep(time.Second)
	}
	if c == nil {
		return
	}
	// A queue of its own, deleted after: nothing of it is audited.
	name := fmt.Sprintf("misuse-close-%s.%d", w.proc, w.idx)
	defer w.dropQueue(ctx, name)
	q := c.Queue(name)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_ = q.Configure(sctx, queen.QueueOptions{LeaseTime: time.Minute})
	cancel()
	push := func() {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _ = q.Push(pctx, []queen.Item{{Partition: "p", Data: []byte("misuse")}})
		cancel()
	}
	push()
	started := make(chan struct{})
	var once sync.Once
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		_ = q.Consume(cctx, queen.ConsumeOptions{SoftStop: 20 * time.Second}, func(hctx context.Context, _ *queen.Message) error {
			once.Do(func() { close(started) })
			<-hctx.Done()
			return hctx.Err()
		})
	}()
	const within = time.Second
	// A fault may hold the message back (spooled, a claim failed): another
	// every 2s.
	giveUp := time.After(30 * time.Second)
wait:
	for {
		select {
		case <-started:
			break wait
		case <-time.After(2 * time.Second):
			push()
		case <-giveUp:
			// Nothing claimed: no handler to outlast the deadline.
			stop()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_ = c.Close(cctx)
			cancel()
			return
		}
	}
	start := time.Now()
	inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "close", Deadline: start.Add(within).UnixNano()})
	closed := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		closed <- c.Close(cctx)
	}()
	select {
	case err := <-closed:
		if err != nil {
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		} else {
			w.rec.Done(inv, history.OK, history.Event{})
		}
	case <-time.After(within + 60*time.Second):
		w.rec.Done(inv, history.Info, history.Event{Err: "Close did not return"})
	}
	stop()
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
	}
}

// dropQueue deletes a queue the run does not audit, retrying through
// faults: a message left in it would count as never pushed.
func (w *worker) dropQueue(ctx context.Context, name string) {
	for range 10 {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := w.c.Queue(name).Delete(dctx)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(time.Second)
	}
}
