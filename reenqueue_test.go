package queen_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/stmt"
)

// The segment the client builds for a skip-policy re-enqueue is byte for
// byte the one the previous release's raw_segment builds in SQL from the
// same fields, and it decodes back to them.
func TestRequeueSegmentMatchesRawSegment(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	id := uuid.Must(uuid.FromString("0af76519-16cd-43dd-8448-eb211c80319c"))
	hdrs := frame.EncodeHeaders(testHeaders)
	for _, tc := range []struct {
		name    string
		flags   byte
		txn     string
		key     string
		hdrs    []byte
		payload []byte
	}{
		{name: "no key, no headers", txn: "t1", payload: []byte("payload")},
		{name: "key", txn: "t2", key: "order-42", payload: []byte("p")},
		{name: "headers", txn: "t3", hdrs: hdrs, payload: []byte("p")},
		{name: "key and headers", txn: "t4", key: "k", hdrs: hdrs, payload: []byte("p")},
		// A decoded frame's flags carry the key and header bits; only the
		// encryption bit is taken, the others follow the fields.
		{name: "encrypted", flags: frame.FlagEncrypted | frame.FlagKey | frame.FlagHeaders, txn: "t5", key: "k",
			hdrs: hdrs, payload: bytes.Repeat([]byte{0xc3}, 40)},
		{name: "empty payload", txn: "t6", payload: []byte{}},
		{name: "nil payload", txn: "t7"},
		{name: "empty transaction id", payload: []byte("p")},
		{name: "non-ASCII transaction id and key", txn: "überweisung-€-日本", key: "schlüssel", payload: []byte("ü")},
		// Lengths past one varint byte and past the prefix's low bytes.
		{name: "long transaction id", txn: strings.Repeat("x", 300), key: strings.Repeat("k", 200), payload: []byte("p")},
		{name: "large payload", txn: "t8", payload: bytes.Repeat([]byte("0123456789abcdef"), 5000)},
	} {
		got := queen.RequeueSegment(id, tc.flags, tc.txn, tc.key, tc.hdrs, tc.payload)
		var want []byte
		if err := c.Pool().QueryRow(ctx, "SELECT "+pgx.Identifier{c.Schema(), "raw_segment"}.Sanitize()+
			"($1::uuid, $2::int4, $3::text, $4::bytea, $5::text, $6::bytea)",
			id, int32(tc.flags), tc.txn, tc.payload, tc.key, tc.hdrs).Scan(&want); err != nil {
			t.Fatalf("%s: raw_segment: %v", tc.name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: Go built\n%x\nraw_segment built\n%x", tc.name, got, want)
			continue
		}
		f := onlyFrame(t, got)
		if got[0] != segment.CodecRaw || f.ID != id || f.Flags&frame.FlagEncrypted != tc.flags&frame.FlagEncrypted ||
			f.TransactionID != tc.txn || f.Key != tc.key || !bytes.Equal(f.Headers, tc.hdrs) || !bytes.Equal(f.Payload, tc.payload) {
			t.Errorf("%s: decodes to %+v", tc.name, f)
		}
	}
}

// Through the current statements: a skip-policy failure (settle and
// settle_keyed) re-enqueues, and RequeueDeadLetters requeues, the stored
// frame exactly, plaintext and encrypted.
func TestReenqueueKeepsFrame(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = bytes.Repeat([]byte{9}, 32) })
	reenqueueRoundTrip(t, c, c)
}

// reenqueueRoundTrip has act (a client of cur's schema and key, possibly
// on another release's statements) fail messages under the skip policy,
// by Fail, dead-letter and requeue them, and checks after each step that
// the copy at the tail holds the original's stored frame byte for byte and
// that cur consumes it once, with the original's id, transaction id, key,
// headers and payload; then act fails one from a per-key parallel Consume
// and consumes its copy, checked likewise.
func reenqueueRoundTrip(t *testing.T, cur, act *queen.Client) {
	ctx := ctxT(t)
	for _, enc := range []bool{false, true} {
		name := map[bool]string{false: "rt-plain", true: "rt-sealed"}[enc]
		opts := queen.QueueOptions{Encryption: enc, FailurePolicy: queen.FailureSkip, RetryLimit: 5, DeadLetter: true,
			RetryBackoff: noBackoff}
		q, aq := configure(t, cur, name, opts), act.Queue(name)
		// Partition names are unique in the schema: storedFrames reads by
		// name alone.
		p := name
		push(t, q, queen.Item{Partition: p, TransactionID: "tx-ü-" + name, Key: "schlüssel", Headers: testHeaders,
			Data: []byte("payload-ü")},
			queen.Item{Partition: p, TransactionID: "tx-empty-" + name, Data: []byte{}})

		// Offsets 0 and 1 fail by Fail: copies at 2 and 3.
		var orig []*queen.Message
		for off := int64(0); off < 2; off++ {
			ms := pop(t, aq, queen.PopOptions{Partition: p})
			if len(ms) != 1 || ms[0].Offset != off {
				t.Fatalf("%s: pop %d: %d messages", name, off, len(ms))
			}
			if err := ms[0].Fail(ctx, errors.New("later")); err != nil {
				t.Fatalf("%s: Fail: %v", name, err)
			}
			orig = append(orig, ms[0])
		}
		wantCopy(t, cur, name, p, 0, 2)
		wantCopy(t, cur, name, p, 1, 3)
		copies := pop(t, q, queen.PopOptions{Partition: p, Batch: 10})
		wantSame(t, name+" re-enqueued", copies, orig, 2)
		for _, m := range copies {
			if m.Attempt != 2 {
				t.Fatalf("%s: copy at %d: Attempt %d, want 2 (the failure it carries)", name, m.Offset, m.Attempt)
			}
		}

		// The copies go to the dead letters and come back: 4 and 5.
		for _, m := range copies {
			if err := m.DeadLetter(ctx, errors.New("dead")); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := aq.RequeueDeadLetters(ctx, queen.DeadLetterQuery{}); err != nil || n != 2 {
			t.Fatalf("%s: RequeueDeadLetters = %d, %v; want 2", name, n, err)
		}
		wantCopy(t, cur, name, p, 0, 4)
		wantCopy(t, cur, name, p, 1, 5)
		back := pop(t, q, queen.PopOptions{Partition: p, Batch: 10})
		wantSame(t, name+" requeued", back, orig, 4)
		for _, m := range back {
			ack(t, m)
		}
		if ms := pop(t, q, queen.PopOptions{Partition: p, Batch: 10}); len(ms) != 0 {
			t.Fatalf("%s: %d more messages after the copies, first at %d", name, len(ms), ms[0].Offset)
		}

		// Per-key parallel Consume (settle_keyed): key a's message fails,
		// key b's succeeds; a's copy lands at 2 and the same Consume takes
		// it. (It stops after the copy: a handler's error once stopping is
		// an interrupt, not a failure.)
		kp := name + "-keyed"
		push(t, q, queen.Item{Partition: kp, TransactionID: "ka-" + name, Key: "a", Headers: testHeaders, Data: []byte("a")},
			queen.Item{Partition: kp, TransactionID: "kb-" + name, Key: "b", Data: []byte("b")})
		var mu sync.Mutex
		var failed, copied []*queen.Message
		err := consumeUntil(t, aq, queen.ConsumeOptions{PopOptions: queen.PopOptions{Partition: kp, Batch: 10}, KeyConcurrency: 2},
			func(_ context.Context, m *queen.Message) error {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case m.Offset == 0:
					failed = append(failed, m)
					return errors.New("skip me")
				case m.Offset >= 2:
					copied = append(copied, m)
				}
				return nil
			}, func() bool { mu.Lock(); defer mu.Unlock(); return len(copied) > 0 })
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: Consume: %v", name, err)
		}
		if len(failed) != 1 {
			t.Fatalf("%s: keyed handler failed %d messages, want 1", name, len(failed))
		}
		wantCopy(t, cur, name, kp, 0, 2)
		wantSame(t, name+" keyed re-enqueued", copied, failed, 2)
		if ms := pop(t, q, queen.PopOptions{Partition: kp, Batch: 10}); len(ms) != 0 {
			t.Fatalf("%s keyed: %d more messages after the copy, first at %d", name, len(ms), ms[0].Offset)
		}
	}

	// A plaintext dead letter of a queue encrypted since is sealed by act
	// when requeued: the copy is the original frame with its payload
	// sealed, and cur opens it.
	late := configure(t, cur, "rt-late", queen.QueueOptions{DeadLetter: true})
	push(t, late, queen.Item{Partition: "rt-late", TransactionID: "late-ü", Key: "k", Headers: testHeaders, Data: []byte("plain")})
	dl := pop(t, act.Queue("rt-late"), queen.PopOptions{})
	if len(dl) != 1 {
		t.Fatalf("rt-late: %d messages", len(dl))
	}
	if err := dl[0].DeadLetter(ctx, errors.New("dead")); err != nil {
		t.Fatal(err)
	}
	configure(t, cur, "rt-late", queen.QueueOptions{Encryption: true, DeadLetter: true})
	if n, err := act.Queue("rt-late").RequeueDeadLetters(ctx, queen.DeadLetterQuery{}); err != nil || n != 1 {
		t.Fatalf("rt-late: RequeueDeadLetters = %d, %v; want 1", n, err)
	}
	frames := storedFrames(t, cur, "rt-late")
	if len(frames) != 2 {
		t.Fatalf("rt-late: %d messages stored, want 2", len(frames))
	}
	o, c := frames[0], frames[1]
	if c.Flags&frame.FlagEncrypted == 0 || bytes.Contains(c.Payload, []byte("plain")) || c.ID != o.ID ||
		c.TransactionID != o.TransactionID || c.Key != o.Key || !bytes.Equal(c.Headers, o.Headers) {
		t.Fatalf("rt-late: requeued frame %+v, original %+v", c, o)
	}
	wantSame(t, "rt-late requeued", pop(t, late, queen.PopOptions{Batch: 10}), dl, 1)
}

// wantCopy checks that the segment at offset copyOff of partition p of
// queue is the stored frame at offset origOff, alone in a raw-codec blob:
// byte for byte (decoding and re-encoding a frame reproduces its bytes).
func wantCopy(t *testing.T, c *queen.Client, queue, p string, origOff, copyOff int64) {
	t.Helper()
	frames := storedFrames(t, c, p)
	if int64(len(frames)) <= copyOff {
		t.Fatalf("%s/%s: %d messages stored, no copy at %d", queue, p, len(frames), copyOff)
	}
	_, blob := segmentBlob(t, c, queen.DefaultTenant, queue, p, copyOff)
	want := append([]byte{segment.CodecRaw}, frame.Append(nil, &frames[origOff])...)
	if !bytes.Equal(blob, want) {
		t.Fatalf("%s/%s: the copy at %d is\n%x\nnot offset %d's frame\n%x", queue, p, copyOff, blob, origOff, want)
	}
}

// wantSame checks that got are copies of want, in order, from offset
// first on: same id, transaction id, key, headers and payload.
func wantSame(t *testing.T, what string, got, want []*queen.Message, first int64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d messages, want %d", what, len(got), len(want))
	}
	for i, g := range got {
		w := want[i]
		if g.Offset != first+int64(i) || g.ID != w.ID || g.TransactionID != w.TransactionID || g.Key != w.Key ||
			!maps.Equal(g.Headers, w.Headers) || !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("%s: got offset %d %s %q key %q headers %q data %q, want offset %d %s %q key %q headers %q data %q",
				what, g.Offset, g.ID, g.TransactionID, g.Key, g.Headers, g.Data,
				first+int64(i), w.ID, w.TransactionID, w.Key, w.Headers, w.Data)
		}
	}
}

// A skip-policy failure sent to settle_v2 or settle_keyed_v2 without its
// segment, and a dead letter sent to requeue_dead_letters_v2 without one,
// fail the call with a clear error and change nothing: the same failure
// and requeue then succeed through the client.
func TestReenqueueWithoutSegmentFails(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	cs := stmt.NewConsume(c.Schema())
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5, DeadLetter: true,
		RetryBackoff: noBackoff})
	push(t, q, queen.Item{Partition: "p", Key: "k", Data: []byte("m")}, queen.Item{Partition: "p", Data: []byte("n")})
	ms := pop(t, q, queen.PopOptions{})
	if len(ms) != 1 {
		t.Fatalf("pop: %d messages", len(ms))
	}
	m := ms[0]
	var pid int64
	if err := c.Pool().QueryRow(ctx, "SELECT id FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
		" WHERE name = 'p'").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	lease := uuid.Must(uuid.FromString(m.LeaseID))
	one := func(sql string, args ...any) error {
		rows, err := c.Pool().Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	dl := []any{[]uuid.UUID{m.ID}, []string{m.TransactionID}, []int32{0}, [][]byte{m.Data}, []time.Time{m.CreatedAt},
		[]string{m.Key}, [][]byte{nil}}
	for _, tc := range []struct {
		what, sql string
		args      []any
		want      string
	}{
		{"settle_v2", cs.Settle, append([]any{[]int64{pid}, []string{""}, []uuid.UUID{lease}, []int64{-1},
			[]int16{stmt.ActFail}, []int64{0}, []bool{false}, []string{"x"}}, append(dl, [][]byte{nil}, []int64(nil))...),
			"settle input 1 re-enqueues a failure without its segment"},
		{"settle_v2, blobs not aligned", cs.Settle, append([]any{[]int64{pid}, []string{""}, []uuid.UUID{lease}, []int64{-1},
			[]int16{stmt.ActFail}, []int64{0}, []bool{false}, []string{"x"}}, append(dl, [][]byte{}, []int64(nil))...),
			"settle arrays are not aligned"},
		{"settle_keyed_v2", cs.SettleKeyed, append([]any{[]int64{pid}, []string{""}, []uuid.UUID{lease}, []int64{0},
			[]int16{stmt.ActFail}, []bool{false}, []string{"x"}}, append(dl, [][]byte{nil}, []int64(nil))...),
			"settle_keyed input 1 re-enqueues a failure without its segment"},
	} {
		if err := one(tc.sql, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want an error saying %q", tc.what, err, tc.want)
		}
	}
	if err := m.Fail(ctx, errors.New("later")); err != nil {
		t.Fatal(err)
	}
	if frames := storedFrames(t, c, "p"); len(frames) != 3 {
		t.Fatalf("%d messages stored after the failure, want 3 (one copy)", len(frames))
	}
	ms = pop(t, q, queen.PopOptions{Batch: 10})
	wantData(t, ms, "n", "m")
	if err := ms[0].DeadLetter(ctx, errors.New("dead")); err != nil {
		t.Fatal(err)
	}
	dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %+v, %v", dls, err)
	}
	var qid int64
	if err := c.Pool().QueryRow(ctx, "SELECT id FROM "+pgx.Identifier{c.Schema(), "queues"}.Sanitize()+
		" WHERE name = 'q'").Scan(&qid); err != nil {
		t.Fatal(err)
	}
	if err := one(cs.Requeue, qid, []int64{dls[0].ID}, [][]byte{make([]byte, 16)}, [][]byte{nil}, []*int32{nil},
		[][]byte{nil}); err == nil || !strings.Contains(err.Error(), "a dead letter without its segment") {
		t.Fatalf("requeue_dead_letters_v2 without the segment: %v", err)
	}
	if n, err := q.RequeueDeadLetters(ctx, queen.DeadLetterQuery{}); err != nil || n != 1 {
		t.Fatalf("RequeueDeadLetters = %d, %v; want 1 (the dead letter kept)", n, err)
	}
}
