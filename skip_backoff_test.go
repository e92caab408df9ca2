package queen_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// Under FailureSkip a failing message waits its backoff before its copy
// is appended (its deliveries are at least Min apart), the messages behind
// it pass at once, and RetryLimit still ends it in a dead letter with its
// attempts counted across copies.
func TestSkipBackoffWaitsWhileOthersPass(t *testing.T) {
	c := open(t)
	const wait = 300 * time.Millisecond
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 3, DeadLetter: true,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}})
	push(t, q, queen.Item{Partition: "p", Data: []byte("m")}, queen.Item{Partition: "p", Data: []byte("b0")},
		queen.Item{Partition: "p", Data: []byte("b1")}, queen.Item{Partition: "p", Data: []byte("b2")})
	var mu sync.Mutex
	var mStart, mEnd, bAt []time.Time
	var attempts []int
	var offsets []int64
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 1}, Concurrency: 1,
		SoftStop: slack /* the last failure is charged, not handed back */},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if string(m.Data) != "m" {
				bAt = append(bAt, time.Now())
				return nil
			}
			mStart, attempts, offsets = append(mStart, time.Now()), append(attempts, m.Attempt), append(offsets, m.Offset)
			defer func() { mEnd = append(mEnd, time.Now()) }()
			return errors.New("downstream down")
		}, func() bool { mu.Lock(); defer mu.Unlock(); return len(mStart) == 3 && len(bAt) == 3 })
	if err != nil {
		t.Fatal(err)
	}
	if len(attempts) != 3 || attempts[0] != 1 || attempts[1] != 2 || attempts[2] != 3 {
		t.Fatalf("attempts %v, want 1, 2, 3", attempts)
	}
	if offsets[0] != 0 || offsets[1] <= 3 || offsets[2] <= offsets[1] {
		t.Errorf("offsets %v: want the original, then copies at the tail", offsets)
	}
	for k := 1; k < 3; k++ {
		if gap := mStart[k].Sub(mEnd[k-1]); gap < wait {
			t.Errorf("attempt %d came %s after failure %d, want at least %s", k+1, gap, k, wait)
		}
	}
	for i, at := range bAt {
		if !at.Before(mStart[1]) {
			t.Errorf("b%d handled at %s, not before the failed message's second attempt at %s", i, at, mStart[1])
		}
	}
	dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters after the 3rd failure: %d, %v", len(dls), err)
	}
	if dls[0].Attempts != 3 || string(dls[0].Data) != "m" {
		t.Errorf("dead letter %q with %d attempts, want m with 3", dls[0].Data, dls[0].Attempts)
	}
}

// A handler's RetryAfter is the wait under FailureSkip too, also with the
// queue's backoff disabled; a copy keeps its transaction id, and the move
// does not drop it as a duplicate of its original within the dedup window.
func TestSkipRetryAfterWaits(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5,
		DedupWindow: time.Hour, RetryBackoff: noBackoff})
	push(t, q, queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("m")})
	m := pop(t, q, queen.PopOptions{Partition: "p"})
	if len(m) != 1 {
		t.Fatalf("popped %d", len(m))
	}
	const wait = 400 * time.Millisecond
	failed := time.Now() // the wait counts from the settle, which runs after this
	if err := m[0].RetryAfter(ctx, wait); err != nil {
		t.Fatal(err)
	}
	got, at := popUntil(t, q, "p")
	if got.ID != m[0].ID || got.TransactionID != "t1" || got.Attempt != 2 {
		t.Fatalf("got %s (txn %q) attempt %d, want the copy of %s, attempt 2", got.ID, got.TransactionID, got.Attempt, m[0].ID)
	}
	if gap := at.Sub(failed); gap < wait {
		t.Errorf("the copy came %s after the failure, want at least %s", gap, wait)
	}
	ack(t, got)
}

// With the backoff disabled and no RetryAfter, a FailureSkip copy is
// appended at once, as before retry backoff.
func TestSkipNoBackoffRequeuesAtOnce(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5, RetryBackoff: noBackoff})
	pushN(t, q, "p", "m", 1)
	m := pop(t, q, queen.PopOptions{})
	if err := m[0].Fail(ctxT(t), errors.New("x")); err != nil {
		t.Fatal(err)
	}
	if m = pop(t, q, queen.PopOptions{}); len(m) != 1 || m[0].Attempt != 2 {
		t.Fatalf("the copy is not delivered at once: %v", m)
	}
}

// A client closed while a FailureSkip copy waits loses nothing: the copy
// is a committed row, and a client opened later appends and delivers it
// once, not before its wait.
func TestSkipBackoffSurvivesReopen(t *testing.T) {
	schema := pgtest.Schema(t)
	cfg := queen.Config{DatabaseURL: pgtest.URL(t), Schema: schema, Logger: pgtest.Logger(t), SpoolDir: t.TempDir()}
	c1, err := queen.Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	const wait = time.Second
	q1 := configure(t, c1, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}})
	pushN(t, q1, "p", "m", 1)
	m := pop(t, q1, queen.PopOptions{})
	if len(m) != 1 {
		t.Fatalf("popped %d", len(m))
	}
	failed := time.Now() // the wait counts from the settle, which runs after this
	if err := m[0].Fail(ctxT(t), errors.New("x")); err != nil {
		t.Fatal(err)
	}
	if err := c1.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	c2 := open(t, func(c *queen.Config) { c.Schema = schema })
	q2 := c2.Queue("q")
	got, at := popUntil(t, q2, "p")
	if got.ID != m[0].ID || got.Attempt != 2 {
		t.Fatalf("got %s attempt %d, want the copy of %s, attempt 2", got.ID, got.Attempt, m[0].ID)
	}
	if gap := at.Sub(failed); gap < wait {
		t.Errorf("the copy came %s after the failure, want at least %s", gap, wait)
	}
	ack(t, got)
	if more := pop(t, q2, queen.PopOptions{Wait: 2 * wait}); len(more) != 0 {
		t.Fatalf("delivered again after its ack: %q attempt %d", more[0].Data, more[0].Attempt)
	}
	st, err := q2.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Partitions) != 1 || st.Partitions[0].LastOffset != 1 {
		t.Errorf("partitions %+v: want p with the original and one copy (last offset 1)", st.Partitions)
	}
}

// Per-key Consume (KeyConcurrency 4) under FailureSkip: a failed message's
// copy waits its backoff, while every other key's message of the lane,
// pushed before the failure, is handled before the copy.
func TestSkipBackoffKeyed(t *testing.T) {
	c := open(t)
	const wait = 300 * time.Millisecond
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5, Lanes: 1,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}})
	keys := []string{"a", "b", "c", "d", "a", "b", "c", "d"}
	items := make([]queen.Item, len(keys))
	for i, k := range keys {
		items[i] = queen.Item{Key: k, Data: []byte(k + string(rune('0'+i)))}
	}
	push(t, q, items...)
	var mu sync.Mutex
	var failEnd, retryAt time.Time
	var retryAttempt int
	others := map[string]time.Time{}
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 16}, KeyConcurrency: 4, SoftStop: slack},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case string(m.Data) != "a0":
				others[string(m.Data)] = time.Now()
			case m.Attempt == 1:
				defer func() { failEnd = time.Now() }()
				return errors.New("downstream down")
			default:
				retryAt, retryAttempt = time.Now(), m.Attempt
			}
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return !retryAt.IsZero() && len(others) == len(keys)-1 })
	if err != nil {
		t.Fatal(err)
	}
	if retryAttempt != 2 {
		t.Fatalf("the copy came with attempt %d, want 2", retryAttempt)
	}
	if gap := retryAt.Sub(failEnd); gap < wait {
		t.Errorf("the copy came %s after the failure, want at least %s", gap, wait)
	}
	for d, at := range others {
		if !at.Before(retryAt) {
			t.Errorf("%s handled at %s, not before the copy at %s", d, at, retryAt)
		}
	}
}

// A FailureSkip copy waiting its backoff is not a user's schedule: Status
// counts it in RetriesWaiting, not Scheduled; CancelScheduled leaves it;
// and a DeliverAt of its transaction id meanwhile is Scheduled, not a
// Duplicate of it.
func TestSkipBackoffCopyIsNotASchedule(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5, DedupWindow: time.Hour,
		RetryBackoff: queen.RetryBackoff{Min: time.Hour, Max: time.Hour}})
	push(t, q, queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("m1")},
		queen.Item{Partition: "p", TransactionID: "t2", Data: []byte("m2")})
	for _, want := range []string{"m1", "m2"} {
		m := pop(t, q, queen.PopOptions{Partition: "p"})
		wantData(t, m, want)
		if err := m[0].Fail(ctx, errors.New("x")); err != nil {
			t.Fatal(err)
		}
	}
	status := func() queen.QueueStatus {
		t.Helper()
		st, err := q.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := status(); st.RetriesWaiting != 2 || st.Scheduled != 0 || !st.NextDue.IsZero() {
		t.Fatalf("after two failures: RetriesWaiting %d, Scheduled %d, NextDue %s; want 2, 0, zero",
			st.RetriesWaiting, st.Scheduled, st.NextDue)
	}
	if n, err := q.CancelScheduled(ctx, []string{"t1", "t2"}); err != nil || n != 0 {
		t.Fatalf("CancelScheduled of the failed messages' ids: %d, %v; want 0", n, err)
	}
	res := push(t, q, queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("later"), DeliverAt: time.Now().Add(time.Hour)})
	if res[0].Status != queen.Scheduled {
		t.Fatalf("DeliverAt of a waiting copy's transaction id: %v, want Scheduled", res[0].Status)
	}
	if st := status(); st.RetriesWaiting != 2 || st.Scheduled != 1 {
		t.Fatalf("RetriesWaiting %d, Scheduled %d; want 2, 1", st.RetriesWaiting, st.Scheduled)
	}
	if n, err := q.CancelScheduled(ctx, []string{"t1"}); err != nil || n != 1 {
		t.Fatalf("CancelScheduled of the user's schedule: %d, %v; want 1", n, err)
	}
	if st := status(); st.RetriesWaiting != 2 || st.Scheduled != 0 {
		t.Fatalf("after the cancel: RetriesWaiting %d, Scheduled %d; want 2, 0", st.RetriesWaiting, st.Scheduled)
	}
}

// On an encrypted queue a FailureSkip copy waits as the stored ciphertext
// and, when due, is appended (not held as plaintext would be) with its id,
// transaction id, key and headers, and still decrypts.
func TestSkipBackoffEncryptedCopy(t *testing.T) {
	c := open(t, withKey(testKey(9)))
	ctx := ctxT(t)
	const wait = 200 * time.Millisecond
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5, Encryption: true,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}})
	push(t, q, queen.Item{Partition: "p", Key: "k", TransactionID: "t1", Headers: testHeaders, Data: []byte("secret")})
	m := pop(t, q, queen.PopOptions{Partition: "p"})
	wantData(t, m, "secret")
	if err := m[0].Fail(ctx, errors.New("x")); err != nil {
		t.Fatal(err)
	}
	got, _ := popUntil(t, q, "p")
	if got.ID != m[0].ID || string(got.Data) != "secret" || got.Key != "k" || got.TransactionID != "t1" ||
		got.Attempt != 2 || len(got.Headers) != len(testHeaders) || got.Headers["tenant"] != "ü" {
		t.Fatalf("copy: id %s data %q key %q txn %q attempt %d headers %v", got.ID, got.Data, got.Key, got.TransactionID,
			got.Attempt, got.Headers)
	}
	ack(t, got)
	if st, err := q.Status(ctx); err != nil || st.RetriesWaiting != 0 || st.Scheduled != 0 {
		t.Fatalf("status after the copy: %+v, %v", st, err)
	}
}

// Two FailureSkip copies whose originals' hash rows are gone (their dedup
// window passed) both carry the zero hash and both wait; the partition
// purged meanwhile (what the idle-partition purge deletes) is created
// again by the move, which appends both, each with its failure counted.
func TestSkipBackoffCopiesOutliveTheirPartition(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5,
		RetryBackoff: queen.RetryBackoff{Min: time.Hour, Max: time.Hour}})
	push(t, q, queen.Item{Partition: "p", Data: []byte("m1")}, queen.Item{Partition: "p", Data: []byte("m2")})
	tbl := func(name string) string { return pgx.Identifier{c.Schema(), name}.Sanitize() }
	exec := func(sql string) {
		t.Helper()
		if _, err := c.Pool().Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// The hashes gone (a hash row written before migration 017 and
	// purged, the segment holding none): copies get the zero hash.
	exec("DELETE FROM " + tbl("txns"))
	exec("UPDATE " + tbl("segments") + " SET hashes = NULL")
	for _, want := range []string{"m1", "m2"} {
		m := pop(t, q, queen.PopOptions{Partition: "p"})
		wantData(t, m, want)
		if err := m[0].Fail(ctx, errors.New("x")); err != nil {
			t.Fatal(err)
		}
	}
	var zero int
	if err := c.Pool().QueryRow(ctx, "SELECT count(*) FROM "+tbl("scheduled")+" WHERE hash = '\\x00000000000000000000000000000000'::bytea").
		Scan(&zero); err != nil || zero != 2 {
		t.Fatalf("copies with the zero hash: %d, %v; want 2", zero, err)
	}
	// The purge's deletes (segments, hash rows, the partition; cursors
	// cascade), then the copies fall due.
	exec("DELETE FROM " + tbl("segments"))
	exec("DELETE FROM " + tbl("partitions"))
	exec("UPDATE " + tbl("scheduled") + " SET due_at = now()")
	got := map[string]int{}
	for len(got) < 2 {
		m, _ := popUntil(t, q, "p")
		got[string(m.Data)] = m.Attempt
		ack(t, m)
	}
	if got["m1"] != 2 || got["m2"] != 2 {
		t.Fatalf("copies delivered with attempts %v, want m1 and m2 at 2", got)
	}
}

// Client.Tx's Fail under FailureSkip waits too: the copy comes at least
// the backoff after the transaction that failed it.
func TestSkipBackoffInTx(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	const wait = 300 * time.Millisecond
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}})
	pushN(t, q, "p", "m", 1)
	m := pop(t, q, queen.PopOptions{Partition: "p"})
	failed := time.Now()
	if err := c.Tx(ctx, func(tx *queen.Tx) error { tx.Fail(m[0], errors.New("x")); return nil }); err != nil {
		t.Fatal(err)
	}
	got, at := popUntil(t, q, "p")
	if got.ID != m[0].ID || got.Attempt != 2 {
		t.Fatalf("got %s attempt %d, want the copy of %s, attempt 2", got.ID, got.Attempt, m[0].ID)
	}
	if gap := at.Sub(failed); gap < wait {
		t.Errorf("the copy came %s after the failure, want at least %s", gap, wait)
	}
	ack(t, got)
}
