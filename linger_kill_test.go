package queen_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// A process killed while its lease lingers over a drained partition holds
// that partition for a few seconds, not a whole LeaseTime: the ack that
// keeps the lease brings its end in. Another consumer of the group then
// takes what is pushed there.
func TestConsumeLingerKilledHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	url, schema := pgtest.URL(t), pgtest.Schema(t)
	ctx := ctxT(t)
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: schema, Citus: onLayout(), SpoolDir: t.TempDir(), Logger: pgtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	q := c.Queue("q")
	const leaseTime = 2 * time.Minute
	if err := q.Configure(ctx, queen.QueueOptions{LeaseTime: leaseTime}); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestConsumeLingerKilledHolderChild$", "-test.v")
	// The child is killed, so it cannot remove a directory of its own.
	cmd.Env = append(os.Environ(), "QUEEN_LINGER_CHILD=1", "QUEEN_FAULT_URL="+url, "QUEEN_FAULT_SCHEMA="+schema,
		"QUEEN_CHILD_SPOOL="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	}()
	handled := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var d string
			if _, err := fmt.Sscanf(sc.Text(), "HANDLED %s", &d); err == nil {
				handled <- d
			}
		}
	}()
	// The child's Consume may start after this push: it finds the message
	// either way.
	if _, err := q.Push(ctx, []queen.Item{{Partition: "p", Data: []byte("m0")}}); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-handled:
		if d != "m0" {
			t.Fatalf("child handled %q", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the child handled nothing in 30s")
	}
	// Lingering: the ack kept the lease, with its end brought in.
	deadline := time.Now().Add(10 * time.Second)
	var g queen.GroupStatus
	for {
		g = lingerStatus(t, q, "p")
		if g.Leased && g.Committed >= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child's lease does not linger after its ack: %+v", g)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if left := time.Until(g.LeaseExpiresAt); left > 15*time.Second {
		t.Errorf("a lingering lease ends in %s; want at most the linger's few seconds, not the lease time (%s)", left.Round(time.Second), leaseTime)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	_ = cmd.Wait()
	killedAt := time.Now()

	if _, err := q.Push(ctx, []queen.Item{{Partition: "p", Data: []byte("m1")}}); err != nil {
		t.Fatal(err)
	}
	log := newLingerLog()
	startConsume(t, q, queen.ConsumeOptions{}, log.handler("parent"))
	r := log.next(t, 30*time.Second)
	if r.data != "m1" {
		t.Fatalf("handled %+v, want m1", r)
	}
	t.Logf("m1 handled %s after the holder was killed", time.Since(killedAt).Round(time.Millisecond))
}

// TestConsumeLingerKilledHolderChild is the process
// TestConsumeLingerKilledHolder kills while its lease lingers.
func TestConsumeLingerKilledHolderChild(t *testing.T) {
	if os.Getenv("QUEEN_LINGER_CHILD") != "1" {
		t.Skip("child process of TestConsumeLingerKilledHolder")
	}
	ctx := context.Background()
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: os.Getenv("QUEEN_FAULT_URL"), Schema: os.Getenv("QUEEN_FAULT_SCHEMA"), Citus: onLayout(),
		SpoolDir: os.Getenv("QUEEN_CHILD_SPOOL")})
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(os.Stdout)
	_ = c.Queue("q").Consume(ctx, queen.ConsumeOptions{}, func(_ context.Context, m *queen.Message) error {
		fmt.Fprintf(w, "HANDLED %s\n", m.Data)
		return w.Flush()
	})
}

// A batch taken under a lingering lease, whose end the ack brought in to
// a few seconds, is renewed while its handler runs past that: no other
// consumer gets it, and it is handled once.
func TestConsumeLingerLongHandlerKeepsLease(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a lingering lease's bound")
	}
	c := open(t, manual)
	ctx := ctxT(t)
	q := c.Queue("q")
	if err := q.Configure(ctx, queen.QueueOptions{LeaseTime: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	log := newLingerLog()
	slow := log.handler("a")
	startConsume(t, q, queen.ConsumeOptions{}, func(ctx context.Context, m *queen.Message) error {
		if string(m.Data) == "m1" {
			time.Sleep(13 * time.Second) // past the linger's 10 s
		}
		return slow(ctx, m)
	})
	if _, err := q.Push(ctx, []queen.Item{{Partition: "p", Data: []byte("m0")}}); err != nil {
		t.Fatal(err)
	}
	if r := log.next(t, 30*time.Second); r.data != "m0" {
		t.Fatalf("handled %+v, want m0", r)
	}
	deadline := time.Now().Add(10 * time.Second)
	for g := lingerStatus(t, q, "p"); !g.Leased || g.Committed < 0; g = lingerStatus(t, q, "p") {
		if time.Now().After(deadline) {
			t.Fatalf("no lingering lease: %+v", g)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A second consumer of the group, ready to take the partition the
	// moment the lease ends.
	other := open(t, manual, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
	startConsume(t, other.Queue("q"), queen.ConsumeOptions{}, log.handler("b"))
	if _, err := q.Push(ctx, []queen.Item{{Partition: "p", Data: []byte("m1")}}); err != nil {
		t.Fatal(err)
	}
	r := log.next(t, 40*time.Second)
	if r.data != "m1" || r.by != "a" || r.attempt != 1 {
		t.Fatalf("handled %+v, want m1 by a, attempt 1 (all: %+v)", r, log.all())
	}
	log.nothing(t, time.Second)
}
