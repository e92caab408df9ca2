package queen_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// Maintenance mode that ends while a client opens (after Open read the
// flag, before the spool drain's first poll) is seen by that poll, which
// kicks the drain: the drain's loop must see the engine as Open wired it.
// Under -race, the loop reading the drain before Open published it is a
// reported race.
func TestMaintenanceEndingDuringOpen(t *testing.T) {
	admin := open(t)
	ctx := ctxT(t)
	if err := admin.SetMaintenance(ctx, true); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	setFlag := func(on bool) error {
		_, err := conn.Exec(ctx, `UPDATE `+pgx.Identifier{admin.Schema()}.Sanitize()+`.settings SET maintenance = $1`, on)
		return err
	}
	// The flag goes off right after Open read it, before the services
	// start.
	var reads atomic.Int32
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = flagReads{func() {
		if reads.Add(1) == 1 {
			if err := setFlag(false); err != nil {
				t.Error(err)
			}
		}
	}}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := queen.Open(ctx, queen.Config{Pool: pool, Schema: admin.Schema(), Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	waitFor(t, 5*time.Second, "the new client to see maintenance end", func() bool { return !c.Maintenance() })
	if n := reads.Load(); n < 2 {
		t.Fatalf("the flag was read %d times: want Open's read and the drain's", n)
	}
}

// flagReads calls after each time a statement that reads the maintenance
// flag ends.
type flagReads struct{ after func() }

type flagRead struct{}

func (f flagReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "SELECT maintenance FROM") {
		return context.WithValue(ctx, flagRead{}, true)
	}
	return ctx
}

// TraceQueryEnd calls after outside a transaction only: a read inside
// Open's migration holds the row the update needs.
func (f flagReads) TraceQueryEnd(ctx context.Context, c *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(flagRead{}) != nil && c.PgConn().TxStatus() == 'I' {
		f.after()
	}
}
