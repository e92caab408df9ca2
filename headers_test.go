package queen_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

func wantHeaders(t testing.TB, what string, got, want map[string]string) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Fatalf("%s: headers %q, want %q", what, got, want)
	}
}

var testHeaders = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "ü", "empty": ""}

// Headers come back from Pop and Consume as pushed; a message without
// headers has none, and the stored frame carries them in its headers field.
func TestHeadersRoundTripPopAndConsume(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("h"), Headers: testHeaders}, queen.Item{Data: []byte("none")},
		queen.Item{Data: []byte("k"), Key: "key", Headers: map[string]string{"a": "1"}})
	fs := storedFrames(t, c, queen.DefaultPartition)
	if len(fs) != 2 || fs[0].Flags&frame.FlagHeaders == 0 || fs[1].Flags&frame.FlagHeaders != 0 {
		t.Fatalf("stored frames %+v", fs)
	}
	msgs := pop(t, q, queen.PopOptions{Partition: queen.DefaultPartition, Batch: 2})
	wantData(t, msgs, "h", "none")
	wantHeaders(t, "pop", msgs[0].Headers, testHeaders)
	if msgs[1].Headers != nil {
		t.Fatalf("message without headers has %q", msgs[1].Headers)
	}
	// Writing to the returned map changes nothing stored.
	msgs[0].Headers["tenant"] = "other"
	for _, m := range msgs {
		ack(t, m)
	}

	var got atomic.Pointer[queen.Message]
	err := consumeUntil(t, q, queen.ConsumeOptions{}, func(_ context.Context, m *queen.Message) error {
		got.Store(m)
		return nil
	}, func() bool { return got.Load() != nil })
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	m := got.Load()
	if m.Key != "key" {
		t.Fatalf("consumed %+v", m)
	}
	wantHeaders(t, "consume", m.Headers, map[string]string{"a": "1"})
}

// PushTx and Tx.Push store the headers with the caller's transaction.
func TestHeadersPushTxAndTxPush(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("q")
	if err := pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
		_, err := q.PushTx(ctx, tx, []queen.Item{{Data: []byte("ptx"), Headers: map[string]string{"via": "PushTx"}}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Push("q", []queen.Item{{Data: []byte("tx"), Headers: map[string]string{"via": "Tx.Push"}}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	msgs := pop(t, q, queen.PopOptions{Batch: 10})
	wantData(t, msgs, "ptx", "tx")
	wantHeaders(t, "PushTx", msgs[0].Headers, map[string]string{"via": "PushTx"})
	wantHeaders(t, "Tx.Push", msgs[1].Headers, map[string]string{"via": "Tx.Push"})
}

// Items pushed in maintenance mode are spooled with their headers and
// replayed with them.
func TestHeadersSurviveSpoolReplay(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("warm")})
	setMaintenance(t, c, true)
	waitFor(t, 5*time.Second, "maintenance", c.Maintenance)
	if r := push(t, q, queen.Item{Data: []byte("spooled"), Key: "k", Headers: testHeaders})[0]; r.Status != queen.Buffered {
		t.Fatalf("%+v, want Buffered", r)
	}
	setMaintenance(t, c, false)
	waitFor(t, 10*time.Second, "the drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	var found bool
	for range 10 {
		msgs := pop(t, q, queen.PopOptions{Batch: 10})
		for _, m := range msgs {
			if string(m.Data) == "spooled" {
				wantHeaders(t, "replayed", m.Headers, testHeaders)
				found = true
			}
			ack(t, m)
		}
		if found {
			break
		}
	}
	if !found {
		t.Fatal("spooled message not found")
	}
}

// The skip policy's re-enqueue (built in SQL) and dead letters keep the
// headers, on a plain and on an encrypted queue.
func TestHeadersSurviveRequeueAndDeadLetter(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = bytes.Repeat([]byte{7}, 32) })
	ctx := ctxT(t)
	for _, enc := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "sealed"}[enc]
		q := configure(t, c, name, queen.QueueOptions{Encryption: enc, FailurePolicy: queen.FailureSkip, RetryLimit: 5, DeadLetter: true,
			RetryBackoff: noBackoff})
		// storedFrames reads by partition name alone: one per queue.
		push(t, q, queen.Item{Partition: name, Data: []byte("m"), Key: "k", Headers: testHeaders},
			queen.Item{Partition: name, Data: []byte("n"), Headers: map[string]string{"x": "y"}})
		msgs := pop(t, q, queen.PopOptions{})
		wantData(t, msgs, "m")
		m := msgs[0]
		if err := m.Fail(ctx, errors.New("later")); err != nil {
			t.Fatal(err)
		}
		msgs = pop(t, q, queen.PopOptions{})
		wantData(t, msgs, "n")
		if err := msgs[0].DeadLetter(ctx, errors.New("dead")); err != nil {
			t.Fatal(err)
		}
		again := pop(t, q, queen.PopOptions{})
		wantData(t, again, "m")
		if again[0].Offset == m.Offset || again[0].ID != m.ID {
			t.Fatalf("%s: not the re-enqueued copy: offset %d", name, again[0].Offset)
		}
		wantHeaders(t, name+" re-enqueued", again[0].Headers, testHeaders)
		if err := again[0].DeadLetter(ctx, errors.New("dead too")); err != nil {
			t.Fatal(err)
		}
		if enc {
			for _, f := range storedFrames(t, c, m.Partition) {
				if f.Flags&frame.FlagEncrypted == 0 || f.Flags&frame.FlagHeaders == 0 {
					t.Fatalf("%s: stored frame flags %#x", name, f.Flags)
				}
			}
		}
		dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
		if err != nil || len(dls) != 2 {
			t.Fatalf("%s: dead letters %+v, %v", name, dls, err)
		}
		for _, d := range dls {
			want := map[string]string{"x": "y"}
			if string(d.Data) == "m" {
				want = testHeaders
			}
			wantHeaders(t, name+" dead letter "+string(d.Data), d.Headers, want)
		}
	}
}

// On an encrypted queue the headers are stored in the clear but
// authenticated: headers altered in storage make the message undecodable.
func TestHeadersAuthenticatedOnEncryptedQueue(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = bytes.Repeat([]byte{8}, 32) })
	q := configure(t, c, "q", queen.QueueOptions{Encryption: true})
	push(t, q, queen.Item{Partition: "p", Data: []byte("secret"), Headers: map[string]string{"a": "b"}})
	pid, blob := segmentBlob(t, c, queen.DefaultTenant, "q", "p", 0)
	f := onlyFrame(t, blob)
	if !bytes.Contains(f.Headers, []byte("a")) || bytes.Contains(f.Payload, []byte("secret")) {
		t.Fatalf("stored frame %+v", f)
	}
	f.Headers = frame.EncodeHeaders(map[string]string{"a": "c"})
	setSegmentBlob(t, c, pid, 0, append([]byte{0}, frame.Append(nil, &f)...))
	if got := pop(t, q, queen.PopOptions{AutoAck: true}); len(got) != 0 {
		t.Fatalf("altered headers delivered: %+v", got[0])
	}
	if r := deadReason(t, c, q, "p"); !strings.Contains(r, "undecodable") {
		t.Fatalf("dead letter reason %q", r)
	}
}

// Bad header names or values fail the whole call with ErrInvalidName, and
// headers over MaxHeadersSize with ErrTooLarge; nothing is written.
func TestHeadersRejected(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("q")
	big := strings.Repeat("v", queen.MaxHeadersSize)
	cases := map[string]struct {
		h    map[string]string
		want error
	}{
		"empty name":      {map[string]string{"": "v"}, queen.ErrInvalidName},
		"NUL in name":     {map[string]string{"a\x00b": "v"}, queen.ErrInvalidName},
		"invalid UTF-8":   {map[string]string{"a\xff": "v"}, queen.ErrInvalidName},
		"NUL in value":    {map[string]string{"a": "v\x00"}, queen.ErrInvalidName},
		"value not UTF-8": {map[string]string{"a": "\xc3"}, queen.ErrInvalidName},
		"over 64 KiB":     {map[string]string{"a": big}, queen.ErrTooLarge},
	}
	for name, tc := range cases {
		items := []queen.Item{{Data: []byte("ok")}, {Data: []byte("bad"), Headers: tc.h}}
		if _, err := q.Push(ctx, items); !errors.Is(err, tc.want) {
			t.Fatalf("%s: Push err %v, want %v", name, err, tc.want)
		}
		err := pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
			_, err := q.PushTx(ctx, tx, items)
			return err
		})
		if !errors.Is(err, tc.want) {
			t.Fatalf("%s: PushTx err %v, want %v", name, err, tc.want)
		}
		err = c.Tx(ctx, func(tx *queen.Tx) error {
			tx.Push("q", items)
			return nil
		})
		if !errors.Is(err, tc.want) {
			t.Fatalf("%s: Tx.Push err %v, want %v", name, err, tc.want)
		}
	}
	// Exactly at the limit is accepted: the count, the lengths and the bytes.
	at := strings.Repeat("v", queen.MaxHeadersSize-1-1-1-3)
	if r := push(t, q, queen.Item{Headers: map[string]string{"a": at}}); r[0].Status != queen.Queued {
		t.Fatalf("at the limit: %+v", r[0])
	}
	if got := storedFrames(t, c, queen.DefaultPartition); len(got) != 1 {
		t.Fatalf("%d messages stored, want only the one at the limit", len(got))
	}
}

// Items pushed while PostgreSQL is down are spooled (sealed for the spool,
// since the client has a key) with their headers, and replayed with them.
func TestHeadersSurviveOutageSpool(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	cl := pgtest.NewCluster(t, pgcluster.Options{})
	var g gate
	pool := gatedPool(t, cl.URL, &g)
	c := open(t, func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Schema, cfg.Pool, cfg.SpoolDir = "", "outage", pool, t.TempDir()
		cfg.StatementTimeout, cfg.EncryptionKey = 2*time.Second, make([]byte, 32)
	})
	t.Cleanup(g.open)
	ctx := ctxT(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("before")})
	if err := cl.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	g.hang()
	res, _, err := pushTimed(t, q, 30*time.Second, queen.Item{Partition: "p", Data: []byte("during"), Key: "k", Headers: testHeaders})
	if err != nil || res[0].Status != queen.Buffered {
		t.Fatalf("push during the outage: %+v, %v", res, err)
	}
	g.open()
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the spool to drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	msgs := pop(t, q, queen.PopOptions{Partition: "p", Batch: 10})
	wantData(t, msgs, "before", "during")
	wantHeaders(t, "replayed after the outage", msgs[1].Headers, testHeaders)
}

// Per-key parallel Consume settles out of order (settle_keyed): its
// re-enqueue and its dead letters keep the headers too.
func TestHeadersKeyedConsumeRequeueAndDeadLetter(t *testing.T) {
	c := open(t)
	for _, limit := range []int{5, 1} {
		q := configure(t, c, fmt.Sprintf("q%d", limit), queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: limit, DeadLetter: true,
			RetryBackoff: noBackoff})
		push(t, q, queen.Item{Partition: "p", Key: "a", Data: []byte("a"), Headers: testHeaders},
			queen.Item{Partition: "p", Key: "b", Data: []byte("b"), Headers: map[string]string{"b": "1"}})
		var mu sync.Mutex
		seen := map[string][]map[string]string{}
		ctx, cancel := context.WithCancel(ctxT(t))
		errc := make(chan error, 1)
		go func() {
			errc <- q.Consume(ctx, queen.ConsumeOptions{KeyConcurrency: 2, PopOptions: queen.PopOptions{Batch: 10, Wait: 100 * time.Millisecond}},
				func(_ context.Context, m *queen.Message) error {
					mu.Lock()
					seen[m.Key] = append(seen[m.Key], m.Headers)
					first := len(seen[m.Key]) == 1
					mu.Unlock()
					if m.Key == "a" && first {
						return errors.New("fail once")
					}
					return nil
				})
		}()
		// Stopping Consume hands back a failure it has not written yet:
		// wait for the outcome itself.
		waitFor(t, 20*time.Second, "the failure's outcome", func() bool {
			if limit == 1 {
				dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
				return err == nil && len(dls) == 1
			}
			mu.Lock()
			defer mu.Unlock()
			return len(seen["a"]) == 2
		})
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		for _, h := range seen["a"] { // Consume has returned: no lock needed
			wantHeaders(t, "delivered a", h, testHeaders)
		}
		if limit == 1 {
			dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
			if err != nil || len(dls) != 1 {
				t.Fatalf("dead letters %+v, %v", dls, err)
			}
			wantHeaders(t, "keyed dead letter", dls[0].Headers, testHeaders)
		}
	}
}
