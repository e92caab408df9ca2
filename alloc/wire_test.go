package alloc_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/alloc"
)

// TestPushLeavesNoBufferWithTheConnection: on the binary path a bundle's
// messages are written in the Bundle's own buffer, lent to the connection's
// frontend. Once Push returns the frontend must not hold it, whether the
// call's message was small (a flush keeps a buffer under 1 KiB), large (a
// flush drops a larger one) or never sent (the context ended first):
// otherwise the connection's next statement would write into the buffer the
// Bundle's next call sends, perhaps on another connection at the same time.
// Each call's verdicts are right, and the connection works after it.
func TestPushLeavesNoBufferWithTheConnection(t *testing.T) {
	ctx, pool, sql := setup(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tenant := uuid.Must(uuid.NewV4())
	var b alloc.Bundle
	held := func(step string) {
		t.Helper()
		var buf []byte
		conn.Conn().PgConn().Frontend().Send(alloc.Probe{Buf: &buf})
		if len(b.Wire()) == 0 && cap(b.Wire()) == 0 {
			t.Fatalf("%s: the Bundle has no wire buffer: the binary path did not run", step)
		}
		if alloc.Aliases(buf, b.Wire()) {
			t.Fatalf("%s: the connection's frontend still writes into the Bundle's buffer", step)
		}
		var one int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("%s: the connection after the call: %v", step, err)
		}
	}
	for i, blob := range [][]byte{{0}, make([]byte, 64<<10)} {
		b.Reset()
		b.Add(&alloc.Segment{Tenant: tenant, Queue: "q", Partition: fmt.Sprint("p", i), Count: 1, Hashes: make([]byte, 16), Blob: blob})
		v, err := b.Push(ctx, conn, sql.PushBundle, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(v) != 1 || v[0].Status != alloc.Queued {
			t.Fatalf("call %d: verdicts %+v", i, v)
		}
		held(fmt.Sprintf("a call of %d bytes", len(blob)))
	}
	// A context that ended before the call: the statement is prepared
	// already, so the call gets as far as the lent buffer, not the flush.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	b.Reset()
	b.Add(&alloc.Segment{Tenant: tenant, Queue: "q", Partition: "gone", Count: 1, Hashes: make([]byte, 16), Blob: []byte{0}})
	if _, err := b.Push(cctx, conn, sql.PushBundle, nil); err == nil {
		t.Fatal("a call with an ended context succeeded")
	}
	if conn.Conn().IsClosed() {
		t.Skip("pgx closed the connection on the ended context; nothing more to check")
	}
	held("a call whose context had ended")
}

// TestPushOnABrokenConnectionDropsTheBuffer: a connection that breaks
// during the call is closed by pgx on a goroutine of its own, which sends
// Terminate through the frontend, perhaps into the Bundle's buffer. The
// Bundle then gives its buffer up rather than touch the frontend again or
// reuse what that goroutine may write into (under -race, touching it is a
// data race).
func TestPushOnABrokenConnectionDropsTheBuffer(t *testing.T) {
	ctx, pool, sql := setup(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tenant := uuid.Must(uuid.NewV4())
	var b alloc.Bundle
	b.Add(&alloc.Segment{Tenant: tenant, Queue: "q", Partition: "p", Count: 1, Hashes: make([]byte, 16), Blob: []byte{0}})
	if _, err := b.Push(ctx, conn, sql.PushBundle, nil); err != nil { // prepares the statement
		t.Fatal(err)
	}
	pid := conn.Conn().PgConn().PID()
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	b.Add(&alloc.Segment{Tenant: tenant, Queue: "q", Partition: "p", Count: 1, Hashes: make([]byte, 16), Blob: []byte{0}})
	if _, err := b.Push(ctx, conn, sql.PushBundle, nil); err == nil {
		t.Fatal("a call on a terminated backend succeeded")
	}
	if !conn.Conn().IsClosed() {
		t.Fatal("the connection is not closed after its backend was terminated")
	}
	if cap(b.Wire()) != 0 {
		t.Fatal("the Bundle kept the buffer a closed connection's frontend may still write into")
	}
}
