package queen_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/sqlschema"
)

// heldSchema is a schema of the coordinator at url, not distributed, that
// holds what a schema in use does: a queue with a dedup window, a keyed
// queue, and a queue of several partitions with a group committed partway,
// a live lease, a spent retry, a dead letter, a scheduled item and a
// paused group. want is, per partition of "main", what group g has not
// read yet, in order.
type heldSchema struct {
	url, schema string
	pool        *pgxpool.Pool
	dedupID     map[string]string // dedup's transaction id -> message id
	keyLane     map[string]string // keyed's key -> partition
	want        map[string][]string
	leaseEnd    time.Time // of g's lease on main/p2
}

func newHeldSchema(t *testing.T, url string) *heldSchema {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	h := &heldSchema{url: url, schema: "qc_" + hex.EncodeToString(b[:]),
		dedupID: map[string]string{}, keyLane: map[string]string{}, want: map[string][]string{}}
	pool, err := pgxpool.New(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	h.pool = pool
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Citus's metadata locks can make two sessions' DDL deadlock (40P01):
		// try again.
		var err error
		for range 5 {
			if _, err = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{h.schema}.Sanitize()+" CASCADE"); err == nil {
				break
			}
			time.Sleep(time.Second)
		}
		if err != nil {
			t.Errorf("drop schema: %v", err)
		}
		pool.Close()
	})

	c := h.open(t, false)
	defer func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	ctx := ctxT(t)
	dq := configure(t, c, "dedup", queen.QueueOptions{DedupWindow: time.Hour})
	for i := range 5 {
		r := push(t, dq, queen.Item{Partition: "a", TransactionID: fmt.Sprint("t", i), Data: []byte(fmt.Sprint("d", i))})
		h.dedupID[r[0].TransactionID] = r[0].MessageID.String()
	}
	kq := configure(t, c, "keyed", queen.QueueOptions{Lanes: 4})
	for i := range 8 {
		r := push(t, kq, queen.Item{Key: fmt.Sprint("k", i), Data: []byte(fmt.Sprint("k", i, "-0"))})
		h.keyLane[fmt.Sprint("k", i)] = r[0].Partition
	}

	q := configure(t, c, "main", queen.QueueOptions{RetryLimit: 3, RetryBackoff: noBackoff, DeadLetter: true})
	for i := range 6 {
		pushN(t, q, fmt.Sprint("p", i), fmt.Sprint("p", i, "-"), 4)
	}
	// p0: committed partway.
	msgs := pop(t, q, queen.PopOptions{Group: "g", Partition: "p0", Batch: 2})
	wantData(t, msgs, "p0-0", "p0-1")
	ackAll(t, msgs)
	// p1: a failure spent of the retry budget.
	msgs = pop(t, q, queen.PopOptions{Group: "g", Partition: "p1", Batch: 1})
	wantData(t, msgs, "p1-0")
	if err := msgs[0].Fail(ctx, errors.New("before the conversion")); err != nil {
		t.Fatal(err)
	}
	// p2: a live lease, held across the conversion.
	msgs = pop(t, q, queen.PopOptions{Group: "g", Partition: "p2", Batch: 4, LeaseTime: 40 * time.Second})
	wantData(t, msgs, "p2-0", "p2-1", "p2-2", "p2-3")
	h.leaseEnd = msgs[0].LeaseExpiresAt
	// p3: a dead letter.
	msgs = pop(t, q, queen.PopOptions{Group: "g", Partition: "p3", Batch: 1})
	wantData(t, msgs, "p3-0")
	if err := msgs[0].DeadLetter(ctx, errors.New("poison")); err != nil {
		t.Fatal(err)
	}
	h.want = map[string][]string{
		"p0": {"p0-2", "p0-3"}, "p1": {"p1-0", "p1-1", "p1-2", "p1-3"},
		"p2": {"p2-0", "p2-1", "p2-2", "p2-3"}, "p3": {"p3-1", "p3-2", "p3-3"},
		"p4": {"p4-0", "p4-1", "p4-2", "p4-3"}, "p5": {"p5-0", "p5-1", "p5-2", "p5-3"},
	}
	// A scheduled item, and a paused group.
	r := push(t, q, queen.Item{Partition: "p5", TransactionID: "later", Data: []byte("later"), DeliverAt: time.Now().Add(time.Hour)})
	if r[0].Status != queen.Scheduled {
		t.Fatalf("scheduled push: %+v", r[0])
	}
	// Due while the lease on p2 still holds: moved on the layout.
	r = push(t, q, queen.Item{Partition: "p4", TransactionID: "soon", Data: []byte("soon"), DeliverAt: h.leaseEnd.Add(-10 * time.Second)})
	if r[0].Status != queen.Scheduled {
		t.Fatalf("scheduled push: %+v", r[0])
	}
	h.want["p4"] = append(h.want["p4"], "soon")
	if err := q.Pause(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	if msgs := pop(t, q, queen.PopOptions{Group: "paused", Partitions: 6, Batch: 100}); len(msgs) != 0 {
		t.Fatalf("paused group read %d messages", len(msgs))
	}
	return h
}

func (h *heldSchema) open(t *testing.T, citus bool) *queen.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: h.url, Schema: h.schema, Citus: citus,
		Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatalf("Open (Citus %v): %v", citus, err)
	}
	return c
}

// check reads the converted schema through c (a Config.Citus client):
// nothing lost or duplicated.
func (h *heldSchema) check(t *testing.T, c *queen.Client) {
	t.Helper()
	ctx := ctxT(t)
	if ok, err := sqlschema.Distributed(ctx, h.pool, h.schema); err != nil || !ok {
		t.Fatalf("Distributed = %v, %v; want the schema distributed", ok, err)
	}
	// No second copy of the rows stays behind in the coordinator's shell
	// tables (Citus copies a table's rows into its shards and leaves them).
	for _, tb := range append(slices.Clone(sqlschema.CitusDistributed), sqlschema.CitusReference...) {
		var size int64
		if err := h.pool.QueryRow(ctx, "SELECT pg_relation_size($1::regclass)", pgx.Identifier{h.schema, tb}.Sanitize()).Scan(&size); err != nil {
			t.Fatal(err)
		}
		if size != 0 {
			t.Errorf("%s: %d bytes left in the coordinator's table after the conversion", tb, size)
		}
	}

	// The dedup window catches a repeat pushed before the conversion.
	dq := c.Queue("dedup")
	for i := range 5 {
		id := fmt.Sprint("t", i)
		r := push(t, dq, queen.Item{Partition: "a", TransactionID: id, Data: []byte("again")})
		if r[0].Status != queen.Duplicate || r[0].MessageID.String() != h.dedupID[id] {
			t.Errorf("repeat of %s after the conversion: %+v, want a duplicate of %s", id, r[0], h.dedupID[id])
		}
	}
	if r := push(t, dq, queen.Item{Partition: "a", TransactionID: "t5", Data: []byte("d5")}); r[0].Status != queen.Queued || r[0].Offset != 5 {
		t.Errorf("new push after the conversion: %+v, want queued at offset 5", r[0])
	}
	var got []string
	for len(got) < 6 {
		msgs := pop(t, dq, queen.PopOptions{Group: "d", Batch: 10})
		if len(msgs) == 0 {
			break
		}
		got = append(got, datas(msgs)...)
		ackAll(t, msgs)
	}
	if fmt.Sprint(got) != "[d0 d1 d2 d3 d4 d5]" {
		t.Errorf("dedup queue read %q", got)
	}

	// A key's lane is where it was.
	kq := c.Queue("keyed")
	for k, lane := range h.keyLane {
		r := push(t, kq, queen.Item{Key: k, Data: []byte(k + "-1")})
		if r[0].Status != queen.Queued || r[0].Partition != lane {
			t.Errorf("key %s after the conversion: %+v, want queued on %s", k, r[0], lane)
		}
	}
	byKey := map[string][]string{}
	for n := 0; n < 16; {
		msgs := pop(t, kq, queen.PopOptions{Group: "k", Batch: 100})
		if len(msgs) == 0 {
			t.Fatalf("keyed: read %d of 16", n)
		}
		for _, m := range msgs {
			byKey[m.Key] = append(byKey[m.Key], string(m.Data))
		}
		n += len(msgs)
		ackAll(t, msgs)
	}
	for k := range h.keyLane {
		if fmt.Sprint(byKey[k]) != fmt.Sprintf("[%s-0 %s-1]", k, k) {
			t.Errorf("key %s read %q", k, byKey[k])
		}
	}

	q := c.Queue("main")
	st, err := q.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Scheduled < 1 {
		t.Errorf("Status.Scheduled = %d, want the scheduled items", st.Scheduled)
	}
	for _, p := range st.Partitions {
		for _, g := range p.Groups {
			if g.Group != "g" {
				continue
			}
			if p.Name == "p1" && g.Failures != 1 {
				t.Errorf("p1: %d failures, want the one spent before the conversion", g.Failures)
			}
			if p.Name == "p2" && (!g.Leased || !g.LeaseExpiresAt.Equal(h.leaseEnd)) {
				t.Errorf("p2: %+v, want the lease until %v", g, h.leaseEnd)
			}
		}
	}
	dl, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(dl) != 1 || string(dl[0].Data) != "p3-0" || dl[0].Reason != "poison" {
		t.Errorf("DeadLetters = %+v, %v; want p3-0", dl, err)
	}
	if msgs := pop(t, q, queen.PopOptions{Group: "paused", Partitions: 6, Batch: 100}); len(msgs) != 0 {
		t.Errorf("paused group read %d messages after the conversion", len(msgs))
	}

	// Group g reads what it had not, the leased partition only after the
	// lease expired.
	read := map[string][]string{}
	drain := func() {
		for range 100 {
			msgs := pop(t, q, queen.PopOptions{Group: "g", Batch: 100})
			for _, m := range msgs {
				read[m.Partition] = append(read[m.Partition], string(m.Data))
				if m.Partition == "p2" && time.Now().Before(h.leaseEnd) {
					t.Errorf("p2's %s delivered before the lease ends (%v)", m.Data, h.leaseEnd)
				}
			}
			ackAll(t, msgs)
			if len(msgs) == 0 {
				st, err := q.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				lag := int64(0)
				for _, p := range st.Partitions {
					for _, g := range p.Groups {
						if g.Group == "g" && !(p.Name == "p2" && g.Leased) {
							lag += g.Lag
						}
					}
				}
				if lag == 0 {
					return
				}
			}
		}
		t.Fatalf("group g still lags after 100 pops: read %v", read)
	}
	drain()
	if len(read["p2"]) != 0 {
		t.Fatalf("the leased partition was read: %v", read["p2"])
	}
	time.Sleep(time.Until(h.leaseEnd) + 100*time.Millisecond)
	drain()
	for p, w := range h.want {
		if !slices.Equal(read[p], w) {
			t.Errorf("group g read %q on %s, want %q", read[p], p, w)
		}
	}
	if n, err := q.CancelScheduled(ctx, []string{"later"}); err != nil || n != 1 {
		t.Errorf("CancelScheduled = %d, %v; want 1", n, err)
	}
	if err := q.Resume(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	n := 0
	for range 100 {
		msgs := pop(t, q, queen.PopOptions{Group: "paused", Batch: 100})
		if len(msgs) == 0 && n == 25 {
			break
		}
		n += len(msgs)
		ackAll(t, msgs)
	}
	if n != 25 {
		t.Errorf("the resumed group read %d messages, want 25", n)
	}
}

// testDistributeHeldSchema converts a schema that holds messages, cursors,
// a lease, dead letters, a scheduled item and dedup hashes (Config.Citus on
// a schema migrated without it) and reads it through the layout.
func testDistributeHeldSchema(t *testing.T, url string) {
	h := newHeldSchema(t, url)
	c := h.open(t, true)
	defer func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	h.check(t, c)
}
