package queen_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
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

	expectRejected := func(what string, q *queen.Queue, partition string) {
		t.Helper()
		msgs, err := q.Pop(ctxT(t), queen.PopOptions{Partition: partition})
		if err == nil {
			t.Fatalf("%s: Pop accepted the swapped ciphertext: %q", what, datas(msgs))
		}
		if !errors.Is(err, queen.ErrEncryption) {
			t.Fatalf("%s: Pop = %v, want ErrEncryption", what, err)
		}
	}

	// Another message's payload under x1's own id, same partition.
	pid, x1 := segmentBlob(t, c, queen.DefaultTenant, "x", "p", 1)
	f := onlyFrame(t, x1)
	f.Payload = onlyFrame(t, x0).Payload
	setSegmentBlob(t, c, pid, 1, segment.Compress(nil, frame.Append(nil, &f)))
	wantData(t, pop(t, x, queen.PopOptions{Partition: "p", AutoAck: true}), "x0")
	expectRejected("payload swapped between messages", x, "p")

	// x0's whole segment (its id too) in another partition, another queue,
	// another tenant.
	pid, _ = segmentBlob(t, c, queen.DefaultTenant, "x", "q", 0)
	setSegmentBlob(t, c, pid, 0, x0)
	expectRejected("moved to another partition", x, "q")
	pid, _ = segmentBlob(t, c, queen.DefaultTenant, "y", "p", 0)
	setSegmentBlob(t, c, pid, 0, x0)
	expectRejected("moved to another queue", y, "p")
	pid, _ = segmentBlob(t, c, other.Tenant(), "x", "p", 0)
	setSegmentBlob(t, c, pid, 0, x0)
	expectRejected("moved to another tenant", ox, "p")
}

// Under FailureSkip a failed message is re-enqueued as a copy of its stored
// frame: for an encrypted message, the same ciphertext under the same id,
// partition and queue, which still decrypts. A plaintext message left from
// before the queue turned encrypted is never copied into it as plaintext:
// it is redelivered in place, as under FailurePause.
func TestFailureSkipRequeueRespectsEncryption(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = bytes.Repeat([]byte{5}, 32) })
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{Encryption: true, FailurePolicy: queen.FailureSkip, RetryLimit: 5})
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
	p := configure(t, c, "plain", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5})
	pushN(t, p, "pl", "p", 2)
	configure(t, c, "plain", queen.QueueOptions{Encryption: true, FailurePolicy: queen.FailureSkip, RetryLimit: 5})
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
