package queen_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// push_take on its own: where pop_linger would let the lease go or end the
// linger, the take takes nothing and writes nothing (the holder's
// pop_linger then decides); it never waits for the cursor row; where
// pop_linger would take, it takes the same.

// takeFixture is partition p of queue q with a lease of group "" that
// lingers as Consume's does (m0 claimed under it, then acked through it
// by linger_ack keeping the lease), and m1 pushed after it. No worker
// lingers in this client, so the push took nothing.
type takeFixture struct {
	c     *queen.Client
	q     *queen.Queue
	s     string // the schema, quoted
	pid   int64
	lease string
}

func newTakeFixture(t testing.TB) *takeFixture {
	t.Helper()
	c := open(t, manual, queen.PopRescan(time.Hour))
	f := &takeFixture{c: c, q: c.Queue("q"), s: pgx.Identifier{c.Schema()}.Sanitize()}
	push(t, f.q, queen.Item{Partition: "p", Data: []byte("m0")})
	msgs, err := f.q.Pop(ctxT(t), queen.PopOptions{Partition: "p", Batch: 1})
	if err != nil || len(msgs) != 1 || msgs[0].LeaseID == "" {
		t.Fatalf("Pop = %v, %v; want m0 under a lease", msgs, err)
	}
	f.lease = msgs[0].LeaseID
	if err := c.Pool().QueryRow(ctxT(t), "SELECT id FROM "+f.s+".partitions WHERE name = 'p'").Scan(&f.pid); err != nil {
		t.Fatal(err)
	}
	var st int
	if err := c.Pool().QueryRow(ctxT(t), "SELECT status FROM "+f.s+".linger_ack($1, '', $2::uuid, $3, 60000)",
		f.pid, f.lease, msgs[0].Offset).Scan(&st); err != nil || st != 0 {
		t.Fatalf("linger_ack = %d, %v; want 0 (applied, the lease kept)", st, err)
	}
	push(t, f.q, queen.Item{Partition: "p", Data: []byte("m1")})
	return f
}

// take runs push_take for up to 10 messages under the fixture's lease and
// returns the base offsets of the segments it returned.
func (f *takeFixture) take(t testing.TB, ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []int64 {
	t.Helper()
	rows, err := q.Query(ctx, "SELECT base_offset FROM "+f.s+".push_take($1, '', $2::uuid, 10, 60000)", f.pid, f.lease)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("push_take: %v", err)
	}
	return got
}

// cursor is the cursor row of group "" on p: committed, batch_end, lease.
func (f *takeFixture) cursor(t testing.TB) (committed, batchEnd int64, lease string) {
	t.Helper()
	var be *int64
	var l *string
	if err := f.c.Pool().QueryRow(ctxT(t), "SELECT committed, batch_end, lease_id::text FROM "+f.s+
		".consumers WHERE partition_id = $1 AND group_name = ''", f.pid).Scan(&committed, &be, &l); err != nil {
		t.Fatal(err)
	}
	if be != nil {
		batchEnd = *be
	} else {
		batchEnd = -1
	}
	if l != nil {
		lease = *l
	}
	return committed, batchEnd, lease
}

func TestPushTakeTakesWherePopLingerWould(t *testing.T) {
	skipOnLayout(t, "push_take takes nothing there by design: the lingering worker takes by pop_linger")
	f := newTakeFixture(t)
	if got := f.take(t, ctxT(t), f.c.Pool()); len(got) != 1 || got[0] != 1 {
		t.Fatalf("push_take returned segments at %v, want [1] (m1)", got)
	}
	if c, be, l := f.cursor(t); c != 0 || be != 1 || l != f.lease {
		t.Fatalf("cursor after the take: committed %d, batch_end %d, lease %q; want 0, 1, %q", c, be, l, f.lease)
	}
}

func TestPushTakeDeclines(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, f *takeFixture)
	}{
		{"group paused", func(t *testing.T, f *takeFixture) {
			if err := f.q.Pause(ctxT(t), ""); err != nil {
				t.Fatal(err)
			}
		}},
		{"another partition ready", func(t *testing.T, f *takeFixture) {
			push(t, f.q, queen.Item{Partition: "r", Data: []byte("r0")})
		}},
		{"lease released", func(t *testing.T, f *takeFixture) {
			if ok, err := f.q.ReleaseLease(ctxT(t), "", "p"); err != nil || !ok {
				t.Fatalf("ReleaseLease = %v, %v", ok, err)
			}
		}},
		{"queue delays its messages", func(t *testing.T, f *takeFixture) {
			if err := f.q.Configure(ctxT(t), queen.QueueOptions{DelayedProcessing: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTakeFixture(t)
			tc.do(t, f)
			c0, be0, l0 := f.cursor(t)
			if got := f.take(t, ctxT(t), f.c.Pool()); len(got) != 0 {
				t.Fatalf("push_take returned segments at %v, want nothing", got)
			}
			if c, be, l := f.cursor(t); c != c0 || be != be0 || l != l0 {
				t.Fatalf("push_take wrote the cursor: committed %d, batch_end %d, lease %q; was %d, %d, %q",
					c, be, l, c0, be0, l0)
			}
			if l0 == "" {
				return
			}
			// The holder then calls pop_linger, which ends the linger and
			// lets the lease go.
			var lease *string
			if err := f.c.Pool().QueryRow(ctxT(t), "SELECT lease_id::text FROM "+f.s+".pop_linger($1, '', $2::uuid, 10, 60000)",
				f.pid, f.lease).Scan(&lease); err != nil || lease != nil {
				t.Fatalf("pop_linger after the decline: lease %v, %v; want one row saying over", lease, err)
			}
			if _, _, l := f.cursor(t); l != "" {
				t.Fatalf("after pop_linger the lease is %q, want let go", l)
			}
		})
	}
}

// A cursor row another transaction holds: nothing taken, at once.
func TestPushTakeNeverWaitsForTheCursorRow(t *testing.T) {
	skipOnLayout(t, "push_take takes nothing there by design: the lingering worker takes by pop_linger")
	f := newTakeFixture(t)
	tx, err := f.c.Pool().Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctxT(t), "SELECT 1 FROM "+f.s+".consumers WHERE partition_id = $1 FOR UPDATE", f.pid); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
	defer cancel()
	start := time.Now()
	if got := f.take(t, ctx, f.c.Pool()); len(got) != 0 {
		t.Fatalf("push_take returned segments at %v with the row locked elsewhere, want nothing", got)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("push_take took %s with the row locked elsewhere: it waited", d)
	}
	_ = tx.Rollback(ctxT(t))
	if got := f.take(t, ctxT(t), f.c.Pool()); len(got) != 1 {
		t.Fatalf("push_take once the row is free returned %v, want m1", got)
	}
}

// The server time a take adds to an isolated push, per push: the push's
// writes (the partition row's allocation and the segment, as
// AppendSegment writes them) with or without push_take in the same
// pipeline and implicit transaction, as the hand-off sends them; then, in
// both, one UPDATE of the cursor (committed through batch_end) stands in
// for the worker's ack. The two alternate in blocks of 100 on one
// connection, whose server process's CPU time (/proc/<pid>/schedstat) is
// counted: the load of other processes disturbs it less than wall time,
// and alike for both. take-server-µs/op is the difference. Local
// clusters only (pgtest's own, or a database on this machine).
//
//	go test -run '^$' -bench BenchmarkPushTake -benchtime 4000x -count 3 .
func BenchmarkPushTake(b *testing.B) {
	f := newTakeFixture(b)
	ctx := ctxT(b)
	conn, err := f.c.Pool().Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	if _, err := backendCPU(pid); err != nil {
		b.Skipf("no server process on this machine: %v", err)
	}
	blob := []byte("0123456789")
	takes := 0
	run := func(take bool) {
		bt := &pgx.Batch{}
		bt.Queue("UPDATE "+f.s+".partitions SET last_offset = last_offset + 1, last_write_at = now() WHERE id = $1", f.pid)
		bt.Queue("INSERT INTO "+f.s+".segments (partition_id, base_offset, end_offset, created_at, blob) "+
			"SELECT $1, last_offset, last_offset, now(), $2 FROM "+f.s+".partitions WHERE id = $1", f.pid, blob)
		if take {
			bt.Queue("SELECT count(*) FROM "+f.s+".push_take($1, '', $2::uuid, 1, 60000)", f.pid, f.lease)
			takes++
		}
		if err := conn.SendBatch(ctx, bt).Close(); err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "UPDATE "+f.s+".consumers SET committed = batch_end WHERE partition_id = $1 AND group_name = ''", f.pid); err != nil {
			b.Fatal(err)
		}
	}
	for range 200 { // plans cached, as in a pool's warm connection
		run(false)
		run(true)
	}
	var cpu [2]int64
	var n [2]int
	b.ResetTimer()
	for i := 0; i < b.N; {
		for k, take := range []bool{false, true} {
			c0, _ := backendCPU(pid)
			for j := 0; j < 100 && i+j < b.N; j++ {
				run(take)
				n[k]++
			}
			c1, _ := backendCPU(pid)
			cpu[k] += c1 - c0
		}
		i += 100
	}
	b.StopTimer()
	push, withTake := float64(cpu[0])/1e3/float64(n[0]), float64(cpu[1])/1e3/float64(n[1])
	b.ReportMetric(push, "push-server-µs/op")
	b.ReportMetric(withTake, "push+take-server-µs/op")
	b.ReportMetric(withTake-push, "take-server-µs/op")
	// Each take took its push's message under the lease.
	if c, be, l := f.cursor(b); be != c || l != f.lease || c < int64(takes) {
		b.Fatalf("cursor after %d takes: committed %d, batch_end %d, lease %q", takes, c, be, l)
	}
}

// backendCPU is the CPU time, in ns, of server process pid on this machine.
func backendCPU(pid uint32) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
}
