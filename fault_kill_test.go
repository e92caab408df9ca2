package queen_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// TestFaultKilledPusher: a pushing process is killed with SIGKILL mid-load
// (half of its pushes in its disk spool because maintenance is on); a new
// process on the same spool directory drains it. Every item the dead
// process reported Queued or Buffered is consumed exactly once.
func TestFaultKilledPusher(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	url := pgtest.URL(t)
	schema := pgtest.Schema(t)
	spoolDir := t.TempDir()
	ctx := ctxT(t)
	admin, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: schema, Citus: onLayout(), SpoolDir: t.TempDir(), Logger: pgtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	q := admin.Queue("q")
	if err := q.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestFaultKilledPusherChild$", "-test.v")
	cmd.Env = append(os.Environ(), "QUEEN_FAULT_CHILD=1", "QUEEN_FAULT_URL="+url, "QUEEN_FAULT_SCHEMA="+schema, "QUEEN_FAULT_SPOOL="+spoolDir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reported := map[uuid.UUID]string{}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	phase := 0
	// Stalled means no new result for a while, not slow: a loaded machine
	// can take tens of seconds to start a race-instrumented child.
	const stall = 90 * time.Second
	deadline := time.NewTimer(stall)
	defer deadline.Stop()
	maintenanceAt, killAt := 150, 300
loop:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				break loop
			}
			f := strings.Fields(line)
			if len(f) != 3 || f[0] != "RESULT" {
				continue
			}
			if id, err := uuid.FromString(f[1]); err == nil {
				reported[id] = f[2]
			}
			deadline.Reset(stall)
			switch {
			case phase == 0 && len(reported) >= maintenanceAt:
				if err := admin.SetMaintenance(ctx, true); err != nil {
					t.Fatal(err)
				}
				phase = 1
			case phase == 1 && len(reported) >= killAt:
				_ = cmd.Process.Signal(syscall.SIGKILL)
				phase = 2
			}
		case <-deadline.C:
			t.Fatalf("child stalled at %d results (phase %d)", len(reported), phase)
		}
	}
	_ = cmd.Wait()
	if phase != 2 {
		t.Fatalf("child ended before it was killed (phase %d, %d results)", phase, len(reported))
	}
	var buffered int
	for _, s := range reported {
		if s == string(queen.Buffered) {
			buffered++
		}
	}
	if buffered == 0 {
		t.Fatal("nothing was buffered before the kill")
	}
	if err := admin.SetMaintenance(ctx, false); err != nil {
		t.Fatal(err)
	}
	// The restarted process: same spool directory.
	again, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: schema, Citus: onLayout(), SpoolDir: spoolDir, Logger: pgtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(context.Background())
	waitFor(t, 30*time.Second, "the dead process's spool to drain", func() bool { return again.SpoolStats().PendingRecords == 0 })
	got := drainAll(t, q)
	for id, s := range reported {
		if _, ok := got[id]; !ok {
			t.Fatalf("message %s reported %s is missing (%d reported, %d buffered, %d consumed)", id, s, len(reported), buffered, len(got))
		}
	}
	t.Logf("%d reported (%d buffered), %d consumed", len(reported), buffered, len(got))
}

// TestFaultKilledPusherChild is the process TestFaultKilledPusher kills.
func TestFaultKilledPusherChild(t *testing.T) {
	if os.Getenv("QUEEN_FAULT_CHILD") != "1" {
		t.Skip("child process of TestFaultKilledPusher")
	}
	ctx := context.Background()
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: os.Getenv("QUEEN_FAULT_URL"), Schema: os.Getenv("QUEEN_FAULT_SCHEMA"), Citus: onLayout(),
		SpoolDir: os.Getenv("QUEEN_FAULT_SPOOL")})
	if err != nil {
		t.Fatal(err)
	}
	q := c.Queue("q")
	w := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		res, err := q.Push(ctx, []queen.Item{{TransactionID: fmt.Sprintf("child-%d", i), Partition: fmt.Sprintf("p%d", i%4)}})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(w, "RESULT %s %s\n", res[0].MessageID, res[0].Status)
		w.Flush()
		time.Sleep(2 * time.Millisecond)
	}
}
