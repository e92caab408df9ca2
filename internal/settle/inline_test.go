package settle_test

import (
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/settle"
	"github.com/e03140bc/queen/internal/stmt"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// leases pushes per messages to each of parts partitions of a fresh queue
// and claims each partition under a lease of group "g".
func leases(t *testing.T, parts, per int) (*stmt.Consume, stmt.Querier, []stmt.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, schema := pgtest.Migrated(t)
	s, c := stmt.New(schema), stmt.NewConsume(schema)
	tenant := uuid.Must(uuid.NewV4())
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	var qid int64
	if err := pool.QueryRow(ctx, "INSERT INTO "+tbl("queues")+" (tenant, name) VALUES ($1, 'q') RETURNING id", tenant).Scan(&qid); err != nil {
		t.Fatal(err)
	}
	out := make([]stmt.Lease, parts)
	for p := range parts {
		name := fmt.Sprint("p", p)
		if _, err := pool.Exec(ctx, "INSERT INTO "+tbl("partitions")+" (id, queue_id, name) VALUES ("+tbl("partition_key")+"($1, $2, 0), $1, $2)", qid, name); err != nil {
			t.Fatal(err)
		}
		for range per {
			f := frame.Frame{ID: uuid.Must(uuid.NewV4()), TransactionID: uuid.Must(uuid.NewV4()).String()}
			if _, err := pool.Exec(ctx, s.PushSegment, tenant, "q", name, 1, []byte(rand.Text()[:16]), segment.Single(&f), 0, 0); err != nil {
				t.Fatal(err)
			}
		}
		n := 0
		err := stmt.Pop(ctx, c, pool, stmt.PopParams{
			Tenant: tenant, Queue: "q", Group: "g", Partition: &name, Batch: per, PerPartition: per, Partitions: 1,
			Lease: time.Hour, Owner: "test", Mode: "all",
		}, func(r *stmt.PopRow) error {
			out[p] = stmt.Lease{Partition: r.PartitionID, Group: "g", ID: *r.Lease}
			n++ // a row per segment, one message each
			return nil
		})
		if err != nil || n != per {
			t.Fatalf("pop %s: %d messages, %v", name, n, err)
		}
	}
	return c, pool, out
}

// Settlements arriving alone and in bursts, with random idle spells, are
// settled partly on their callers' goroutines and partly fused: each
// caller gets its own op's verdict exactly once (acks in order applied, a
// repeated ack below the cursor, an ack under a wrong lease lost), and the
// cursor ends past every message.
func TestSettleInlineAndFusedMix(t *testing.T) {
	const parts, per = 6, 25
	sql, pool, ls := leases(t, parts, per)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := settle.New(ctx, settle.Config{Pool: pool, SQL: sql, Hold: time.Millisecond, Timeout: 30 * time.Second})
	defer func() {
		if err := f.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	ack := func(l stmt.Lease, through int64) settle.Op {
		return settle.Op{Settle: stmt.SettleParams{Lease: l, Through: through, At: -1}}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	sent := 0
	for p := range parts {
		wg.Go(func() {
			l := ls[p]
			wrong := l
			wrong.ID = uuid.Must(uuid.NewV4())
			for off := range int64(per) {
				if mrand.IntN(3) == 0 { // an idle spell
					time.Sleep(time.Duration(mrand.IntN(300)) * time.Microsecond)
				}
				ops := []settle.Op{ack(l, off)}
				want := []int16{stmt.SettleApplied}
				switch mrand.IntN(6) {
				case 0: // the ack again, after it: below the cursor
					ops = append(ops, ack(l, off))
					want = append(want, stmt.SettleBelowCursor)
				case 1: // under a lease that is not the cursor's, alone
					ops = []settle.Op{ack(wrong, off), ack(l, off)}
					want = []int16{stmt.SettleLeaseLost, stmt.SettleApplied}
				}
				for k, op := range ops {
					// One op per call is what runs inline; keep its order.
					res, err := f.Settle(context.Background(), []settle.Op{op})
					if err != nil || res[0].Err != nil {
						t.Errorf("p%d: settle %d: %v %v", p, off, err, res)
						return
					}
					if res[0].Status != want[k] {
						t.Errorf("p%d: settle of %d (op %d): status %d, want %d", p, off, k, res[0].Status, want[k])
					}
					mu.Lock()
					sent++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	st := f.Stats()
	if int(st.Items) != sent {
		t.Fatalf("the engine carried %d settlements, %d were sent", st.Items, sent)
	}
	// Every message settled: an ack through the last is below the cursor.
	for p, l := range ls {
		res, err := f.Settle(context.Background(), []settle.Op{ack(l, per-1)})
		if err != nil || res[0].Status != stmt.SettleBelowCursor {
			t.Fatalf("p%d: ack of the last message again: %+v, %v", p, res, err)
		}
	}
	t.Logf("%d settlements in %d flushes, %d inline", st.Items, st.Bundles, st.Inline)
}

// An isolated settlement runs inline; the engine still counts it.
func TestSettleIsolatedRunsInline(t *testing.T) {
	sql, pool, ls := leases(t, 1, 2)
	f := settle.New(context.Background(), settle.Config{Pool: pool, SQL: sql, Hold: time.Millisecond, Timeout: 30 * time.Second})
	defer f.Close(context.Background())
	for off := range int64(2) {
		res, err := f.Settle(context.Background(), []settle.Op{{Settle: stmt.SettleParams{Lease: ls[0], Through: off, At: -1}}})
		if err != nil || res[0].Status != stmt.SettleApplied {
			t.Fatalf("settle %d: %+v, %v", off, res, err)
		}
	}
	if st := f.Stats(); st.Inline != 2 || st.Bundles != 2 || st.Items != 2 {
		t.Fatalf("stats %+v, want 2 inline flushes of one settlement each", st)
	}
}
