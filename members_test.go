package queen_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// groupOf is group g's status on the queue's only partition.
func groupOf(t *testing.T, q *queen.Queue, g string) queen.GroupStatus {
	t.Helper()
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		for _, gs := range p.Groups {
			if gs.Group == g {
				return gs
			}
		}
	}
	return queen.GroupStatus{Group: g}
}

// queueGroup is group g of queue name as Client.Queues reports it.
func queueGroup(t *testing.T, c *queen.Client, name, g string) queen.QueueGroupInfo {
	t.Helper()
	qs, err := c.Queues(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if q.Name != name {
			continue
		}
		for _, gi := range q.Groups {
			if gi.Group == g {
				return gi
			}
		}
	}
	return queen.QueueGroupInfo{Group: g}
}

// blockingConsume runs Consume on q for group with a handler that signals
// started and holds each message until release is closed. It returns the
// Consume's stop and its result.
func blockingConsume(t *testing.T, q *queen.Queue, o queen.ConsumeOptions, started chan<- *queen.Message, release <-chan struct{}) (stop func(), res <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() {
		ch <- q.Consume(ctx, o, func(ctx context.Context, m *queen.Message) error {
			select {
			case started <- m:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		})
	}()
	return cancel, ch
}

// A running Consume is a member of its group with its client's name, host,
// pid, start and last heartbeat; its lease names it; two Consume calls of
// one group are two members; each is gone once its Consume returns. A
// group with lag is Abandoned only without a live member.
func TestConsumeMembers(t *testing.T) {
	c := open(t, queen.MemberTiming(200*time.Millisecond, 10*time.Second))
	q := configure(t, c, "m", queen.QueueOptions{})
	push(t, q, queen.Item{Data: []byte("held")}, queen.Item{Data: []byte("second")})

	started := make(chan *queen.Message, 1)
	release := make(chan struct{})
	before := time.Now()
	stop1, res1 := blockingConsume(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g"}}, started, release)
	m := <-started
	host, _ := os.Hostname()
	var gs queen.GroupStatus
	waitFor(t, 30*time.Second, "the Consume as a member", func() bool {
		gs = groupOf(t, q, "g")
		return len(gs.Members) == 1
	})
	mb := gs.Members[0]
	if mb.ID == "" || mb.Host != host || mb.PID != os.Getpid() || !strings.HasPrefix(mb.Client, host+"/") ||
		mb.Started.Before(before.Add(-time.Second)) || mb.Started.After(time.Now()) || mb.LastSeen.Before(mb.Started) {
		t.Fatalf("member %+v (host %q pid %d, started after %v)", mb, host, os.Getpid(), before)
	}
	if !gs.Leased || gs.LeaseMember != mb.ID || gs.LeaseOwner != mb.Client+"#"+mb.ID || gs.LeaseHolderGone {
		t.Fatalf("lease of member %q: %+v", mb.ID, gs)
	}
	if gs.Lag == 0 || gs.Abandoned {
		t.Fatalf("a group with lag and a member: %+v", gs)
	}
	if st, err := q.Status(ctxT(t)); err != nil || len(st.Members["g"]) != 1 || st.Members["g"][0].ID != mb.ID {
		t.Fatalf("QueueStatus.Members: %+v, %v", st.Members, err)
	}
	if gi := queueGroup(t, c, "m", "g"); len(gi.Members) != 1 || gi.Members[0].ID != mb.ID || gi.Abandoned {
		t.Fatalf("Queues' group: %+v", gi)
	}
	_ = m

	stop2, res2 := blockingConsume(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g"}}, make(chan *queen.Message, 1), release)
	waitFor(t, 30*time.Second, "two members", func() bool { return len(groupOf(t, q, "g").Members) == 2 })
	ms := groupOf(t, q, "g").Members
	if ms[0].ID == ms[1].ID || ms[0].Client != ms[1].Client {
		t.Fatalf("two Consume calls of one client: %+v", ms)
	}

	stop1()
	if err := <-res1; err != nil {
		t.Fatalf("Consume: %v", err)
	}
	// Deleted before Consume returned: no wait.
	if ms := groupOf(t, q, "g").Members; len(ms) != 1 || ms[0].ID == mb.ID {
		t.Fatalf("members after the first Consume returned: %+v", ms)
	}
	stop2()
	if err := <-res2; err != nil {
		t.Fatalf("Consume: %v", err)
	}
	close(release)
	gs = groupOf(t, q, "g")
	if len(gs.Members) != 0 || gs.Lag == 0 || !gs.Abandoned {
		t.Fatalf("lag and no member: %+v", gs)
	}
	if gi := queueGroup(t, c, "m", "g"); len(gi.Members) != 0 || !gi.Abandoned {
		t.Fatalf("Queues' group with lag and no member: %+v", gi)
	}
	// Without lag, no member is not abandoned.
	for {
		msgs, err := q.Pop(ctxT(t), queen.PopOptions{Group: "g", Batch: 10, AutoAck: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			break
		}
	}
	if gs := groupOf(t, q, "g"); gs.Lag != 0 || gs.Abandoned {
		t.Fatalf("no lag: %+v", gs)
	}
	if gi := queueGroup(t, c, "m", "g"); gi.Abandoned {
		t.Fatalf("Queues' group without lag: %+v", gi)
	}
}

// A Pop is a member only when it names itself: its pops create and
// refresh its row, its leases carry its id, and LeaveGroup removes it.
func TestPopMember(t *testing.T) {
	c := open(t)
	q := configure(t, c, "pm", queen.QueueOptions{})
	push(t, q, queen.Item{Data: []byte("a")}, queen.Item{Data: []byte("b")})
	if _, err := q.Pop(ctxT(t), queen.PopOptions{Group: "g"}); err != nil {
		t.Fatal(err)
	}
	gs := groupOf(t, q, "g")
	if len(gs.Members) != 0 || gs.LeaseMember != "" || gs.LeaseHolderGone {
		t.Fatalf("a Pop without Member: %+v", gs)
	}
	if _, err := q.Pop(ctxT(t), queen.PopOptions{Group: "h", Member: "worker-1"}); err != nil {
		t.Fatal(err)
	}
	gs = groupOf(t, q, "h")
	host, _ := os.Hostname()
	if len(gs.Members) != 1 || gs.Members[0].ID != "worker-1" || gs.Members[0].Host != host ||
		gs.Members[0].PID != os.Getpid() || gs.LeaseMember != "worker-1" || gs.LeaseHolderGone {
		t.Fatalf("a Pop member: %+v", gs)
	}
	if _, err := q.Pop(ctxT(t), queen.PopOptions{Group: "h", Member: strings.Repeat("x", 129)}); err == nil {
		t.Fatal("a 129-byte member id was accepted")
	}
	// group_live_members is the SQL side's view of the same.
	live := func() int {
		var n int
		s := pgx.Identifier{c.Schema()}.Sanitize()
		err := c.Pool().QueryRow(ctxT(t), "SELECT count(*) FROM "+s+".group_live_members((SELECT id FROM "+s+
			".queues WHERE name = 'pm'), 'h')").Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := live(); n != 1 {
		t.Fatalf("group_live_members: %d, want 1", n)
	}
	if err := q.LeaveGroup(ctxT(t), "h", "worker-1"); err != nil {
		t.Fatal(err)
	}
	if n := live(); n != 0 {
		t.Fatalf("group_live_members after LeaveGroup: %d", n)
	}
	gs = groupOf(t, q, "h")
	if len(gs.Members) != 0 || !gs.Leased || !gs.LeaseHolderGone {
		t.Fatalf("after LeaveGroup, its lease held: %+v", gs)
	}
}

// A Consume cut off from the database (its connections killed, new ones
// hanging) stops heartbeating: after the member TTL readers show it gone
// while its row is still there, its lease as held by a gone member and
// the group, which has lag, as abandoned; maintenance then deletes the
// row.
func TestMemberCutOffExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	const ttl = 2 * time.Second
	timing := queen.MemberTiming(100*time.Millisecond, ttl)
	noMaint := func(cfg *queen.Config) { cfg.Maintenance.Interval = -1 }
	reader := open(t, timing, noMaint)
	schema := reader.Schema()
	url := pgtest.URL(t)
	q := configure(t, reader, "cut", queen.QueueOptions{})
	push(t, q, queen.Item{Data: []byte("held")})

	var g gate
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.DialFunc = g.dial
	pcfg.ConnConfig.RuntimeParams["application_name"] = "members-cut-" + schema
	pcfg.MaxConns = 64
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cut := open(t, timing, noMaint, func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Schema, cfg.Pool = "", schema, pool
		cfg.StatementTimeout = 2 * time.Second
	})
	t.Cleanup(g.open) // before the cut client closes (cleanups run last-in first-out)

	started := make(chan *queen.Message, 1)
	release := make(chan struct{})
	stop, res := blockingConsume(t, cut.Queue("cut"), queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g",
		LeaseTime: 10 * time.Minute}}, started, release)
	defer func() {
		close(release)
		g.open()
		stop()
		if err := <-res; err != nil {
			t.Errorf("Consume: %v", err)
		}
	}()
	<-started
	var gs queen.GroupStatus
	waitFor(t, 30*time.Second, "the member", func() bool {
		gs = groupOf(t, q, "g")
		return len(gs.Members) == 1
	})
	id := gs.Members[0].ID
	if gs.LeaseMember != id || gs.LeaseHolderGone || gs.Abandoned {
		t.Fatalf("live member %q: %+v", id, gs)
	}

	g.hang()
	admin, err := pgx.Connect(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctxT(t), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
		"members-cut-"+schema); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	waitFor(t, time.Minute, "the cut-off member gone", func() bool {
		gs = groupOf(t, q, "g")
		return len(gs.Members) == 0
	})
	if since := time.Since(cutAt); since < ttl-time.Second {
		t.Fatalf("gone %v after the cut, TTL %v", since, ttl)
	}
	if !gs.Leased || gs.LeaseMember != id || !gs.LeaseHolderGone || gs.Lag != 1 || !gs.Abandoned {
		t.Fatalf("lease of a gone member: %+v", gs)
	}
	if gi := queueGroup(t, reader, "cut", "g"); len(gi.Members) != 0 || !gi.Abandoned {
		t.Fatalf("Queues' group: %+v", gi)
	}
	rows := func() int {
		var n int
		if err := admin.QueryRow(ctxT(t), "SELECT count(*) FROM "+pgx.Identifier{schema, "members"}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := rows(); n != 1 {
		t.Fatalf("%d member rows before maintenance, want the expired one", n)
	}
	rep, err := reader.Maintain(ctxT(t))
	if err != nil || !rep.Ran || rep.MembersExpired != 1 || rows() != 0 {
		t.Fatalf("maintenance: %+v, %v, %d rows", rep, err, rows())
	}
}

// statementCounter counts a pool's statements by kind.
type statementCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	kind := "other"
	switch {
	case strings.Contains(d.SQL, "member_beat"):
		kind = "beat"
	case strings.Contains(d.SQL, ".members"):
		kind = "member"
	case strings.Contains(d.SQL, ".pop_v2("):
		kind = "pop"
	case strings.Contains(d.SQL, ".extend_lease("):
		kind = "extend"
	}
	s.mu.Lock()
	s.n[kind]++
	s.mu.Unlock()
	return ctx
}

func (s *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statementCounter) take() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.n
	s.n = map[string]int{}
	return n
}

// A busy Consume's claims and lease renewals carry its heartbeat: past the
// join it sends none of its own while its last_seen keeps moving. One
// whose only worker is on a long handler, with a lease too long to renew,
// sends its own.
func TestBusyConsumeSendsNoHeartbeats(t *testing.T) {
	const hb = 2 * time.Second
	tr := &statementCounter{n: map[string]int{}}
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c := open(t, queen.MemberTiming(hb, time.Minute), func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Pool = "", pool
	})
	q := configure(t, c, "busy", queen.QueueOptions{})
	push(t, q, queen.Item{Data: []byte("x")}) // a partition, for Status to show the group on
	// Busy: a steady stream of messages, each handled at once.
	ctx, cancel := context.WithCancel(ctxT(t))
	var handled atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g"}},
			func(context.Context, *queen.Message) error { handled.Add(1); return nil })
	}()
	waitFor(t, 30*time.Second, "the member", func() bool { return len(groupOf(t, q, "g").Members) == 1 })
	first := groupOf(t, q, "g").Members[0]
	tr.take()
	end := time.Now().Add(3 * hb)
	for time.Now().Before(end) {
		push(t, q, queen.Item{Data: []byte("x")})
		time.Sleep(20 * time.Millisecond)
	}
	busy := tr.take()
	last := groupOf(t, q, "g").Members[0]
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("busy for %v: %d handled, statements %v", 3*hb, handled.Load(), busy)
	if busy["beat"] != 0 || busy["member"] != 0 || busy["pop"] == 0 || handled.Load() == 0 {
		t.Fatalf("a busy Consume's statements: %v", busy)
	}
	if !last.LastSeen.After(first.LastSeen.Add(hb)) {
		t.Fatalf("last_seen did not move with the claims: %v then %v", first.LastSeen, last.LastSeen)
	}

	// Renewals: one worker on one message, its lease renewed every
	// second, no claim meanwhile.
	started := make(chan *queen.Message, 1)
	release := make(chan struct{})
	push(t, q, queen.Item{Data: []byte("slow")})
	stop, res := blockingConsume(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g", LeaseTime: 2 * time.Second}},
		started, release)
	<-started
	waitFor(t, 30*time.Second, "the member", func() bool { return len(groupOf(t, q, "g").Members) == 1 })
	first = groupOf(t, q, "g").Members[0]
	tr.take()
	time.Sleep(3 * hb) // the span measured, not an assertion's wait
	renewing := tr.take()
	last = groupOf(t, q, "g").Members[0]
	t.Logf("renewing for %v: statements %v", 3*hb, renewing)
	if renewing["beat"] != 0 || renewing["extend"] == 0 || renewing["pop"] != 0 {
		t.Fatalf("a renewing Consume's statements: %v", renewing)
	}
	if !last.LastSeen.After(first.LastSeen.Add(hb)) {
		t.Fatalf("last_seen did not move with the renewals: %v then %v", first.LastSeen, last.LastSeen)
	}
	close(release)
	stop()
	if err := <-res; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}

	// Idle: the worker on a long handler, the lease not due for renewal.
	started = make(chan *queen.Message, 1)
	release = make(chan struct{})
	push(t, q, queen.Item{Data: []byte("long")})
	stop, res = blockingConsume(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g", LeaseTime: time.Hour}},
		started, release)
	<-started
	tr.take()
	waitFor(t, time.Minute, "two heartbeats of an idle Consume", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.n["beat"] >= 2
	})
	idle := tr.take()
	if idle["pop"] != 0 || idle["extend"] != 0 {
		t.Fatalf("an idle Consume's statements: %v", idle)
	}
	close(release)
	stop()
	if err := <-res; err != nil {
		t.Fatal(err)
	}
}

// Client.Close ends a running Consume, which deletes its member row.
func TestConsumeMemberLeavesOnClose(t *testing.T) {
	reader := open(t)
	q := configure(t, reader, "close", queen.QueueOptions{})
	push(t, q, queen.Item{Data: []byte("x")})
	c, err := queen.Open(ctxT(t), queen.Config{DatabaseURL: pgtest.URL(t), Schema: reader.Schema(),
		Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- c.Queue("close").Consume(context.Background(), queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g"},
			SoftStop: time.Second}, func(context.Context, *queen.Message) error { return nil })
	}()
	waitFor(t, 30*time.Second, "the member", func() bool { return len(groupOf(t, q, "g").Members) == 1 })
	if err := c.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, queen.ErrClosed) {
		t.Fatalf("Consume: %v", err)
	}
	if ms := groupOf(t, q, "g").Members; len(ms) != 0 {
		t.Fatalf("members after Close: %+v", ms)
	}
}
