package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/sqlschema"
)

// TestMigrateUpCitus: on a Citus coordinator ($QUEEN_TEST_CITUS_URL, else
// skipped), migrate-up --citus leaves the schema distributed, and again
// changes nothing.
func TestMigrateUpCitus(t *testing.T) {
	url := os.Getenv("QUEEN_TEST_CITUS_URL")
	if url == "" {
		t.Skip("QUEEN_TEST_CITUS_URL not set (internal/citus/cluster.sh start DIR prints one)")
	}
	ctx := ctxT(t)
	schema := "qcli_" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_") + time.Now().Format("150405")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		_ = conn.Close(ctx)
	})
	for i := range 2 {
		r := runCLI(ctx, "migrate-up", "--citus", "--database-url", url, "--schema", schema)
		if r.code != exitOK || !strings.Contains(r.stdout, "distributed across the Citus workers") {
			t.Fatalf("run %d: %+v", i+1, r)
		}
	}
	p, code := (&env{ctx: ctx, stderr: os.Stderr, cmd: cmdValidate, o: opts{url: url}}).pool(1)
	if code != exitOK {
		t.Fatal("pool")
	}
	defer p.Close()
	if ok, err := sqlschema.Distributed(ctx, p, schema); err != nil || !ok {
		t.Fatalf("Distributed = %v, %v after migrate-up --citus", ok, err)
	}
}
