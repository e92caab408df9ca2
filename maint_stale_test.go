package queen_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// A periodic re-read of the maintenance flag that read "off" before this
// client's SetMaintenance(true) committed must not overwrite, when it
// lands after it, what SetMaintenance set: the client would push straight
// to the database in maintenance mode, past the pushes it spooled.
func TestSetMaintenanceNotUndoneByStaleRead(t *testing.T) {
	ctx := ctxT(t)
	var armed atomic.Bool
	var reads atomic.Int32
	blocked := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = flagReads{func() {
		if armed.CompareAndSwap(true, false) {
			close(blocked)
			<-release // the read said "off"; its result lands late
			return
		}
		reads.Add(1)
	}}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	admin := open(t)
	c, err := queen.Open(ctx, queen.Config{Pool: pool, Schema: admin.Schema(), Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	armed.Store(true)
	select {
	case <-blocked: // the spool drain's periodic read, once a second
	case <-time.After(30 * time.Second):
		t.Fatal("no periodic read of the maintenance flag")
	}
	before := reads.Load()
	if err := c.SetMaintenance(ctx, true); err != nil {
		t.Fatal(err)
	}
	// The NOTIFY makes the listener read the flag again ("on"), unless
	// re-reads wait for the blocked one: let it read first if it can.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && reads.Load() == before; {
		time.Sleep(10 * time.Millisecond)
	}
	unblock()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if !c.Maintenance() {
			t.Fatal("maintenance mode reads off after SetMaintenance(true): a read from before it overwrote it")
		}
	}
	if err := c.SetMaintenance(ctx, false); err != nil {
		t.Fatal(err)
	}
}
