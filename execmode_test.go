package queen_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// queen's statements bind arrays whose PostgreSQL types pgx learns from
// the statement's description; without one (exec mode, the simple
// protocol, as a PgBouncer setup may ask for) a push cannot be sent, and
// the client used to answer Buffered and spool it for a replay that fails
// the same way. Open refuses such a connection setting, from the URL or
// a given pool, naming it; the describing modes work.
func TestOpenRefusesExecModesWithoutDescriptions(t *testing.T) {
	url := pgtest.URL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	ctx := ctxT(t)
	for _, mode := range []string{"simple_protocol", "exec"} {
		c, err := queen.Open(ctx, queen.Config{DatabaseURL: url + sep + "default_query_exec_mode=" + mode, SpoolDir: t.TempDir()})
		if err == nil {
			_ = c.Close(ctx)
			t.Fatalf("%s in the URL: Open succeeded", mode)
		}
		if !strings.Contains(err.Error(), "default_query_exec_mode") {
			t.Fatalf("%s in the URL: %v, want an error naming default_query_exec_mode", mode, err)
		}
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		c, err := queen.Open(ctx, queen.Config{Pool: pool, SpoolDir: t.TempDir()})
		if err == nil {
			_ = c.Close(ctx)
		}
		pool.Close()
		if err == nil || !strings.Contains(err.Error(), "default_query_exec_mode") {
			t.Fatalf("a pool in %v: %v, want an error naming default_query_exec_mode", mode, err)
		}
	}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec"} {
		c := open(t, func(cfg *queen.Config) { cfg.DatabaseURL = url + sep + "default_query_exec_mode=" + mode })
		q := c.Queue("m")
		res, err := q.Push(ctx, []queen.Item{{Partition: "p", Data: []byte("x")}})
		if err != nil || res[0].Status != queen.Queued {
			t.Fatalf("%s: push %+v, %v", mode, res, err)
		}
		msgs := pop(t, q, queen.PopOptions{Batch: 10})
		if len(msgs) != 1 || string(msgs[0].Data) != "x" {
			t.Fatalf("%s: popped %q", mode, datas(msgs))
		}
		ack(t, msgs[0])
	}
}
