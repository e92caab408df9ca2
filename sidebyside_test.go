package queen_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/internal/stmt"
	"github.com/e03140bc/queen/sqlschema"
)

// previousStatements is the statement set of the previous release (schema
// version 5), copied from internal/stmt at that release.
const previousStatements = "internal/stmt/testdata/v5"

// A client sending the previous release's statements and a current one
// share a schema the current one migrated: both push and consume the same
// queue together, every message reaches each group once and in order.
func TestPreviousStatementsSideBySide(t *testing.T) {
	skipOnLayout(t, "the previous release's statements predate the layout (its clients cannot set Config.Citus)")
	ctx := ctxT(t)
	schema := pgtest.Schema(t)
	cur := open(t, func(c *queen.Config) { c.Schema = schema })
	restore, err := stmt.Use(os.DirFS(previousStatements))
	if err != nil {
		t.Fatal(err)
	}
	prev := open(t, func(c *queen.Config) { c.Schema = schema })
	restore()
	if err := cur.Queue("q").Configure(ctx, queen.QueueOptions{Lanes: 4, DedupWindow: time.Hour, DeadLetter: true,
		// Short waits: the previous release's failures wait them too.
		RetryBackoff: queen.RetryBackoff{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}

	const perClient = 300
	clients := map[string]*queen.Client{"prev": prev, "cur": cur}
	var wg sync.WaitGroup
	for name, c := range clients {
		wg.Go(func() {
			q := c.Queue("q")
			for i := 0; i < perClient; i += 10 {
				var items []queen.Item
				for j := i; j < i+10; j++ {
					items = append(items, queen.Item{Key: fmt.Sprintf("k%d", j%7), TransactionID: fmt.Sprintf("%s-%d", name, j),
						Data: fmt.Appendf(nil, "%s-%d", name, j)})
				}
				res, err := q.Push(ctx, items)
				if err != nil {
					t.Error(err)
					return
				}
				for _, r := range res {
					if r.Status != queen.Queued {
						t.Errorf("%s push: %+v", name, r)
					}
				}
			}
			// A repeated transaction id is a duplicate whichever client stored it.
			other := "cur"
			if name == "cur" {
				other = "prev"
			}
			res, err := q.Push(ctx, []queen.Item{{Key: "k0", TransactionID: other + "-0", Data: []byte("again")}})
			if err != nil || res[0].Status != queen.Duplicate {
				t.Errorf("%s repeating %s-0: %+v %v", name, other, res, err)
			}
		})
	}
	// Both clients consume queue mode and group g together while the
	// pushes go on; in queue mode the messages at even offsets fail once
	// (settle's failure path), and the rest of their batch waits for the
	// lease to end.
	type seen struct {
		mu   sync.Mutex
		data map[string]int
		last map[string]int64
	}
	groups := map[string]*seen{"": {data: map[string]int{}, last: map[string]int64{}}, "g": {data: map[string]int{}, last: map[string]int64{}}}
	failed := sync.Map{}
	for name, c := range clients {
		for group, s := range groups {
			wg.Go(func() {
				q := c.Queue("q")
				deadline := time.Now().Add(90 * time.Second)
				for time.Now().Before(deadline) {
					s.mu.Lock()
					done := len(s.data) == 2*perClient
					s.mu.Unlock()
					if done {
						return
					}
					ms, err := q.Pop(ctx, queen.PopOptions{Group: group, Batch: 20, Partitions: 2, Wait: 100 * time.Millisecond,
						LeaseTime: 5 * time.Second})
					if err != nil {
						t.Errorf("%s pop %q: %v", name, group, err)
						return
					}
					for _, m := range ms {
						if group == "" && m.Offset%2 == 0 {
							if _, again := failed.LoadOrStore(m.ID, true); !again {
								if err := m.Fail(ctx, errors.New("once")); err != nil {
									t.Errorf("%s fail: %v", name, err)
								}
								break // the rest of the batch is redelivered once the lease ends
							}
						}
						s.mu.Lock()
						s.data[string(m.Data)]++
						if last, ok := s.last[m.Partition]; ok && m.Offset <= last {
							t.Errorf("group %q: %s offset %d after %d", group, m.Partition, m.Offset, s.last[m.Partition])
						}
						s.last[m.Partition] = m.Offset
						s.mu.Unlock()
						if err := m.Ack(ctx); err != nil {
							t.Errorf("%s ack %q: %v", name, group, err)
						}
					}
				}
			})
		}
	}
	wg.Wait()
	for group, s := range groups {
		if len(s.data) != 2*perClient {
			t.Fatalf("group %q got %d distinct messages, want %d", group, len(s.data), 2*perClient)
		}
		for d, n := range s.data {
			if n != 1 {
				t.Fatalf("group %q got %s %d times", group, d, n)
			}
		}
	}
	// Both route keys to the same lanes.
	st, err := cur.Queue("q").Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		if !slices.Contains([]string{"lane-0", "lane-1", "lane-2", "lane-3"}, p.Name) {
			t.Fatalf("partition %s: not a lane of 4", p.Name)
		}
	}
}

// A client on the previous release's statements fails messages on a
// skip-policy queue (through settle and settle_keyed) and requeues dead
// letters (requeue_dead_letters): those entry points build the frame in
// SQL, and each copy is the stored frame byte for byte, which the current
// client consumes once, decodable, with its id, key, headers and payload
// (see reenqueueRoundTrip), on plaintext and encrypted queues.
func TestPreviousStatementsReenqueue(t *testing.T) {
	key := bytes.Repeat([]byte{4}, 32)
	schema := pgtest.Schema(t)
	cur := open(t, func(c *queen.Config) { c.Schema, c.EncryptionKey = schema, key })
	restore, err := stmt.Use(os.DirFS(previousStatements))
	if err != nil {
		t.Fatal(err)
	}
	prev := open(t, func(c *queen.Config) { c.Schema, c.EncryptionKey = schema, key })
	restore()
	reenqueueRoundTrip(t, cur, prev)
}

// A function layer recorded by a newer release (its migration version above
// this binary's) makes Open fail with ErrSchemaTooNew, functions untouched.
func TestOpenFunctionLayerTooNew(t *testing.T) {
	ctx := ctxT(t)
	c := open(t)
	schema := c.Schema()
	pool := pgtest.Pool(t)
	tbl := pgx.Identifier{schema, "schema_functions"}.Sanitize()
	if _, err := pool.Exec(ctx, "UPDATE "+tbl+" SET version = $1, revision = 0, hash = 'newer'", sqlschema.Latest()+1); err != nil {
		t.Fatal(err)
	}
	// A body only this test writes: were the layer applied, it would go.
	if _, err := pool.Exec(ctx, "CREATE OR REPLACE FUNCTION "+pgx.Identifier{schema, "uvarint"}.Sanitize()+
		"(p_n bigint) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$ SELECT '\\x6e6577'::bytea $$"); err != nil {
		t.Fatal(err)
	}
	c2, err := queen.Open(ctx, queen.Config{DatabaseURL: pgtest.URL(t), Schema: schema, Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err == nil {
		_ = c2.Close(context.Background())
	}
	if !errors.Is(err, queen.ErrSchemaTooNew) {
		t.Fatalf("Open: %v, want ErrSchemaTooNew", err)
	}
	var body []byte
	var s sqlschema.FunctionsState
	if err := pool.QueryRow(ctx, "SELECT "+pgx.Identifier{schema, "uvarint"}.Sanitize()+"(1)").Scan(&body); err != nil || string(body) != "new" {
		t.Fatalf("the newer function was replaced: %q %v", body, err)
	}
	if err := pool.QueryRow(ctx, "SELECT version, revision, hash FROM "+tbl).Scan(&s.Version, &s.Revision, &s.Hash); err != nil ||
		s != (sqlschema.FunctionsState{Version: sqlschema.Latest() + 1, Revision: 0, Hash: "newer"}) {
		t.Fatalf("recorded layer %+v %v", s, err)
	}
}
