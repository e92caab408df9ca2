package queen_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/internal/segment"
)

// segmentBlob reads the stored blob of the segment at base in queue's
// partition, for tenant.
func segmentBlob(t *testing.T, c *queen.Client, tenant uuid.UUID, queue, partition string, base int64) (pid int64, blob []byte) {
	t.Helper()
	s := pgx.Identifier{c.Schema()}.Sanitize()
	err := c.Pool().QueryRow(ctxT(t), "SELECT p.id, s.blob FROM "+s+".segments s JOIN "+s+".partitions p ON p.id = s.partition_id"+
		" JOIN "+s+".queues q ON q.id = p.queue_id WHERE q.tenant = $1 AND q.name = $2 AND p.name = $3 AND s.base_offset = $4",
		tenant, queue, partition, base).Scan(&pid, &blob)
	if err != nil {
		t.Fatal(err)
	}
	return pid, blob
}

func setSegmentBlob(t *testing.T, c *queen.Client, pid, base int64, blob []byte) {
	t.Helper()
	if _, err := c.Pool().Exec(ctxT(t), "UPDATE "+pgx.Identifier{c.Schema(), "segments"}.Sanitize()+
		" SET blob = $3 WHERE partition_id = $1 AND base_offset = $2", pid, base, blob); err != nil {
		t.Fatal(err)
	}
}

// onlyFrame unpacks a one-frame segment blob.
func onlyFrame(t *testing.T, blob []byte) frame.Frame {
	t.Helper()
	raw, err := segment.Decompress(nil, blob)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := frame.DecodeAll(raw)
	if err != nil || len(fs) != 1 {
		t.Fatalf("segment holds %d frames, %v", len(fs), err)
	}
	return fs[0]
}

// A ciphertext is bound to its tenant, queue, partition and message id: one
// copied over another message's in the database fails to decrypt instead
// of being delivered as that message.
func TestEncryptedPayloadBoundToMessage(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = bytes.Repeat([]byte{3}, 32) })
	other := c.WithTenant(uuid.Must(uuid.NewV4()))
	enc := queen.QueueOptions{Encryption: true}
	x := configure(t, c, "x", enc)
	y := configure(t, c, "y", enc)
	ox := configure(t, other, "x", enc)
	push(t, x, queen.Item{Data: []byte("x0"), Partition: "p"})
	push(t, x, queen.Item{Data: []byte("x1"), Partition: "p"})
	push(t, x, queen.Item{Data: []byte("xq"), Partition: "q"})
	push(t, y, queen.Item{Data: []byte("y0"), Partition: "p"})
	push(t, ox, queen.Item{Data: []byte("o0"), Partition: "p"})
	_, x0 := segmentBlob(t, c, queen.DefaultTenant, "x", "p", 0)

	// A ciphertext that does not open is never delivered as the message:
	// the pop goes on without it and it is dead-lettered for its reason.
	expectRejected := func(what string, cl *queen.Client, q *queen.Queue, partition string) {
		t.Helper()
		msgs, err := q.Pop(ctxT(t), queen.PopOptions{Partition: partition})
		if err != nil {
			t.Fatalf("%s: Pop = %v, want the message dead-lettered", what, err)
		}
		if len(msgs) != 0 {
			t.Fatalf("%s: Pop accepted the swapped ciphertext: %q", what, datas(msgs))
		}
		if r := deadReason(t, cl, q, partition); !strings.Contains(r, "undecodable") || !strings.Contains(r, "encryption") {
			t.Fatalf("%s: dead-letter reason %q, want an undecodable message and its encryption error", what, r)
		}
	}

	// Another message's payload under x1's own id, same partition.
	pid, x1 := segmentBlob(t, c, queen.DefaultTenant, "x", "p", 1)
	f := onlyFrame(t, x1)
	f.Payload = onlyFrame(t, x0).Payload
	setSegmentBlob(t, c, pid, 1, segment.Compress(nil, frame.Append(nil, &f)))
	wantData(t, pop(t, x, queen.PopOptions{Partition: "p", AutoAck: true}), "x0")
	expectRejected("payload swapped between messages", c, x, "p")

	// x0's whole segment (its id too) in another partition, another queue,
	// another tenant.
	pid, _ = segmentBlob(t, c, queen.DefaultTenant, "x", "q", 0)
	setSegmentBlob(t, c, pid, 0, x0)
	expectRejected("moved to another partition", c, x, "q")
	pid, _ = segmentBlob(t, c, queen.DefaultTenant, "y", "p", 0)
	setSegmentBlob(t, c, pid, 0, x0)
	expectRejected("moved to another queue", c, y, "p")
	pid, _ = segmentBlob(t, c, other.Tenant(), "x", "p", 0)
	setSegmentBlob(t, c, pid, 0, x0)
	expectRejected("moved to another tenant", other, ox, "p")
}

// Under FailureSkip a failed message is re-enqueued as a copy of its stored
// frame: for an encrypted message, the same ciphertext under the same id,
// partition and queue, which still decrypts. A plaintext message left from
// before the queue turned encrypted is never copied into it as plaintext:
// it is redelivered in place, as under FailurePause.
func TestFailureSkipRequeueRespectsEncryption(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = bytes.Repeat([]byte{5}, 32) })
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{Encryption: true, FailurePolicy: queen.FailureSkip, RetryLimit: 5,
		RetryBackoff: noBackoff})
	pushN(t, q, "", "m", 2)
	msgs := pop(t, q, queen.PopOptions{})
	wantData(t, msgs, "m0")
	if err := msgs[0].Fail(ctx, errors.New("later")); err != nil {
		t.Fatal(err)
	}
	again := pop(t, q, queen.PopOptions{Batch: 10})
	wantData(t, again, "m1", "m0")
	if again[1].Offset != 2 || again[1].ID != msgs[0].ID || again[1].Attempt != 2 {
		t.Fatalf("re-enqueued copy: offset %d id %s attempt %d", again[1].Offset, again[1].ID, again[1].Attempt)
	}
	ack(t, again[1])

	// Plaintext from before encryption was switched on.
	p := configure(t, c, "plain", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5, RetryBackoff: noBackoff})
	pushN(t, p, "pl", "p", 2)
	configure(t, c, "plain", queen.QueueOptions{Encryption: true, FailurePolicy: queen.FailureSkip, RetryLimit: 5,
		RetryBackoff: noBackoff})
	msgs = pop(t, p, queen.PopOptions{})
	wantData(t, msgs, "p0")
	if err := msgs[0].Fail(ctx, errors.New("later")); err != nil {
		t.Fatal(err)
	}
	for i, f := range storedFrames(t, c, "pl") {
		if i >= 2 && f.Flags&frame.FlagEncrypted == 0 {
			t.Fatalf("offset %d: plaintext %q re-enqueued into an encrypted queue", i, f.Payload)
		}
	}
	again = pop(t, p, queen.PopOptions{Batch: 10})
	wantData(t, again, "p0", "p1")
	if again[0].Offset != 0 || again[0].Attempt != 2 {
		t.Fatalf("plaintext failure: redelivered at offset %d attempt %d, want in place (0, 2)", again[0].Offset, again[0].Attempt)
	}
}

// Keys rotate without rewriting data: each stored payload names its key,
// Config.EncryptionKey seals new messages and Config.DecryptionKeys open
// what earlier keys sealed, dead letters included.
func TestEncryptionKeyRotation(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	before := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = oldKey })
	ctx := ctxT(t)
	q := configure(t, before, "q", queen.QueueOptions{Encryption: true})
	pushN(t, q, "", "old", 1)
	dl := pop(t, q, queen.PopOptions{Group: "dl"})
	if err := dl[0].DeadLetter(ctx, errors.New("kept")); err != nil {
		t.Fatal(err)
	}

	after := open(t, func(cfg *queen.Config) {
		cfg.Schema, cfg.EncryptionKey, cfg.DecryptionKeys = before.Schema(), newKey, [][]byte{oldKey}
	})
	aq := after.Queue("q")
	pushN(t, aq, "", "new", 1)
	wantData(t, pop(t, aq, queen.PopOptions{Group: "g", Batch: 10, AutoAck: true}), "old0", "new0")
	if d := deadLetters(t, aq); len(d) != 1 || string(d[0].Data) != "old0" {
		t.Fatalf("dead letters read with the old key: %+v", d)
	}
	if f := storedFrames(t, after, "Default"); len(f) != 2 || bytes.Equal(f[0].Payload[:5], f[1].Payload[:5]) {
		t.Fatalf("both messages name the same key: %x, %x", f[0].Payload[:5], f[1].Payload[:5])
	}

	// Without the old key (dropped too early) its messages do not open:
	// the pop fails naming the key id and takes nothing; a client that
	// still has the old key gets them.
	newOnly := open(t, func(cfg *queen.Config) { cfg.Schema, cfg.EncryptionKey = before.Schema(), newKey })
	nq := newOnly.Queue("q")
	if msgs, err := nq.Pop(ctx, queen.PopOptions{Group: "n", Batch: 10}); !errors.Is(err, queen.ErrEncryption) ||
		!strings.Contains(err.Error(), "key id") {
		t.Fatalf("Pop of an old-key message without the old key = %q, %v; want ErrEncryption naming its key id", datas(msgs), err)
	}
	wantData(t, pop(t, aq, queen.PopOptions{Group: "n", Batch: 10}), "old0", "new0")
	if d := deadLetters(t, aq); len(d) != 1 {
		t.Fatalf("dead letters: %+v, want only the one kept", d)
	}

	for name, cfg := range map[string]queen.Config{
		"short decryption key": {DecryptionKeys: [][]byte{make([]byte, 16)}},
		"empty decryption key": {EncryptionKey: newKey, DecryptionKeys: [][]byte{{}}},
	} {
		cfg.DatabaseURL, cfg.Schema = pgtest.URL(t), before.Schema()
		if c, err := queen.Open(ctx, cfg); !errors.Is(err, queen.ErrEncryption) {
			if err == nil {
				c.Close(ctx)
			}
			t.Errorf("Open with a %s = %v, want ErrEncryption", name, err)
		}
	}
}

// Spooled payloads replay to the same tenant, queue, partition and message
// id they were sealed for, so they decrypt; a payload spooled as plaintext
// (the pushing client did not know the queue was encrypted) is sealed on
// replay for the same.
func TestSpoolReplayEncryptedDecrypts(t *testing.T) {
	key := bytes.Repeat([]byte{4}, 32)
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = key })
	fresh := open(t, func(cfg *queen.Config) { cfg.Schema, cfg.EncryptionKey = c.Schema(), key })
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{Encryption: true})
	pushN(t, q, "a", "warm", 1) // c knows q is encrypted; fresh does not
	if err := c.SetMaintenance(ctx, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "fresh to see maintenance", fresh.Maintenance)
	sealed := push(t, q, queen.Item{Partition: "a", Data: []byte("sealed")})[0]
	plain := push(t, fresh.Queue("q"), queen.Item{Partition: "b", Data: []byte("plain")})[0]
	if sealed.Status != queen.Buffered || plain.Status != queen.Buffered {
		t.Fatalf("maintenance pushes: %+v, %+v", sealed, plain)
	}
	if err := c.SetMaintenance(ctx, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "both spools to drain", func() bool {
		return c.SpoolStats().PendingRecords == 0 && fresh.SpoolStats().PendingRecords == 0
	})
	got := drainAll(t, q)
	if len(got) != 3 || got[sealed.MessageID] != "sealed" || got[plain.MessageID] != "plain" {
		t.Fatalf("consumed %v", got)
	}
	for _, p := range []string{"a", "b"} {
		for _, f := range storedFrames(t, c, p) {
			if f.Flags&frame.FlagEncrypted == 0 {
				t.Fatalf("partition %s: plaintext frame %q", p, f.Payload)
			}
		}
	}
}

// deadReason is the reason of the newest dead letter of q's partition, read
// straight from the table: listing them decrypts, and these do not open.
func deadReason(t *testing.T, c *queen.Client, q *queen.Queue, partition string) string {
	t.Helper()
	s := pgx.Identifier{c.Schema()}.Sanitize()
	var r string
	err := c.Pool().QueryRow(ctxT(t), "SELECT coalesce(d.reason, '') FROM "+s+".dead_letters d JOIN "+s+".queues q ON q.id = d.queue_id"+
		" WHERE q.tenant = $1 AND q.name = $2 AND d.partition_name = $3 ORDER BY d.id DESC LIMIT 1", c.Tenant(), q.Name(), partition).Scan(&r)
	if err != nil {
		t.Fatalf("dead letter of %s/%s: %v", q.Name(), partition, err)
	}
	return r
}
