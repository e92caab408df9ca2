package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
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

// TestMigrateUpCitusHeldSchema: migrate-up --citus converts a schema that
// already holds messages and a group's cursors; a Config.Citus client then
// reads the rest, nothing twice.
func TestMigrateUpCitusHeldSchema(t *testing.T) {
	url := os.Getenv("QUEEN_TEST_CITUS_URL")
	if url == "" {
		t.Skip("QUEEN_TEST_CITUS_URL not set (internal/citus/cluster.sh start DIR prints one)")
	}
	ctx := ctxT(t)
	schema := "qcli_held" + time.Now().Format("150405")
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
	open := func(citus bool) *queen.Client {
		c, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: schema, Citus: citus, SpoolDir: t.TempDir()})
		if err != nil {
			t.Fatalf("Open (Citus %v): %v", citus, err)
		}
		return c
	}
	c := open(false)
	q := c.Queue("q")
	var items []queen.Item
	for p := range 4 {
		for i := range 3 {
			items = append(items, queen.Item{Partition: fmt.Sprint("p", p), Data: []byte(fmt.Sprint("p", p, "-", i))})
		}
	}
	if _, err := q.Push(ctx, items); err != nil {
		t.Fatal(err)
	}
	read := map[string]bool{}
	msgs, err := q.Pop(ctx, queen.PopOptions{Group: "g", Partition: "p0", Batch: 2})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("Pop = %d, %v", len(msgs), err)
	}
	for _, m := range msgs {
		read[string(m.Data)] = true
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}

	if r := runCLI(ctx, "migrate-up", "--citus", "--database-url", url, "--schema", schema); r.code != exitOK ||
		!strings.Contains(r.stdout, "distributed across the Citus workers") {
		t.Fatalf("migrate-up --citus: %+v", r)
	}
	c = open(true)
	defer func() { _ = c.Close(context.Background()) }()
	q = c.Queue("q")
	for range 50 {
		msgs, err := q.Pop(ctx, queen.PopOptions{Group: "g", Batch: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if read[string(m.Data)] {
				t.Fatalf("%s read twice", m.Data)
			}
			read[string(m.Data)] = true
			if err := m.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if len(read) == len(items) {
			break
		}
	}
	if len(read) != len(items) {
		t.Fatalf("read %d of %d messages after the conversion", len(read), len(items))
	}
}
