package queen_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func withKey(key []byte) func(*queen.Config) {
	return func(cfg *queen.Config) { cfg.EncryptionKey = key }
}

// openOn opens a second client on c's schema, as another process would.
func openOn(t testing.TB, c *queen.Client, mod ...func(*queen.Config)) *queen.Client {
	t.Helper()
	return open(t, append([]func(*queen.Config){func(cfg *queen.Config) { cfg.Schema = c.Schema() }}, mod...)...)
}

// sortedData is the messages' payloads, sorted: partitions come in claim
// order, which a test should not depend on.
func sortedData(msgs []*queen.Message) []string {
	out := datas(msgs)
	slices.Sort(out)
	return out
}

func wantSorted(t testing.TB, msgs []*queen.Message, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := sortedData(msgs); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func ackAll(t testing.TB, msgs []*queen.Message) {
	t.Helper()
	last := map[string]*queen.Message{}
	for _, m := range msgs {
		last[m.Partition] = m
	}
	for _, m := range last {
		ack(t, m)
	}
}

// undecryptableSetup: queue "q" encrypted with k1; partition "bad" holds b0,
// then x, whose ciphertext was altered in the database (it fails to open
// under k1, a key the client holds), then b2; partitions "a" and "c" hold
// healthy messages.
func undecryptableSetup(t *testing.T) (c1 *queen.Client, q1 *queen.Queue, xID string) {
	t.Helper()
	c1 = open(t, withKey(testKey(1)))
	q1 = configure(t, c1, "q", queen.QueueOptions{Encryption: true, LeaseTime: time.Hour})
	pushN(t, q1, "a", "a", 2)
	pushN(t, q1, "c", "c", 1)
	push(t, q1, queen.Item{Partition: "bad", Data: []byte("b0")})
	x := push(t, q1, queen.Item{Partition: "bad", Data: []byte("x")})
	push(t, q1, queen.Item{Partition: "bad", Data: []byte("b2")})
	pid, blob := segmentBlob(t, c1, queen.DefaultTenant, "q", "bad", 1)
	f := onlyFrame(t, blob)
	f.Payload[len(f.Payload)-1] ^= 1
	setSegmentBlob(t, c1, pid, 1, segment.Compress(nil, frame.Append(nil, &f)))
	return c1, q1, x[0].MessageID.String()
}

// wantDeadLetter checks that the queue's only dead letter is the message
// with id, for a reason mentioning reason. Read from the table: its
// payload does not decrypt.
func wantDeadLetter(t testing.TB, c *queen.Client, id, reason string) {
	t.Helper()
	var got, why string
	var n int
	err := c.Pool().QueryRow(ctxT(t), "SELECT count(*) OVER (), message_id::text, reason FROM "+
		pgx.Identifier{c.Schema(), "dead_letters"}.Sanitize()+" LIMIT 1").Scan(&n, &got, &why)
	if err != nil {
		t.Fatalf("dead letters: %v", err)
	}
	if n != 1 || got != id || !strings.Contains(why, reason) {
		t.Fatalf("%d dead letters, the first %s (%q), want message %s only, with a reason mentioning %q", n, got, why, id, reason)
	}
}

// A pop over several partitions, one of which holds a message that does
// not decrypt under the key that sealed it, delivers the healthy partitions and the healthy prefix of
// the bad one; the undecryptable message goes to the dead-letter store when
// it reaches the head of its partition, and the rest follows at once (no
// lease is left waiting for expiry).
func TestPopUndecryptableMessageIsDeadLetteredAndOthersDelivered(t *testing.T) {
	c, q, xID := undecryptableSetup(t)
	msgs, err := q.Pop(ctxT(t), queen.PopOptions{Batch: 10, Partitions: 3})
	if err != nil {
		t.Fatalf("Pop: %v", err)
	}
	wantSorted(t, msgs, "a0", "a1", "c0", "b0")
	ackAll(t, msgs)
	// The lease on "bad" ended with b0: x is next, at the head.
	msgs = pop(t, q, queen.PopOptions{Batch: 10, Partitions: 3})
	wantData(t, msgs, "b2")
	if msgs[0].Offset != 2 {
		t.Fatalf("b2 at offset %d, want 2", msgs[0].Offset)
	}
	ack(t, msgs[0])
	wantDeadLetter(t, c, xID, "encryption")
	if got := pop(t, q, queen.PopOptions{Batch: 10, Partitions: 3}); len(got) != 0 {
		t.Fatalf("left over: %q", datas(got))
	}
}

// With AutoAck the cursor moves in the claim itself: the undecryptable
// message must end in the dead-letter store, and every healthy message of
// the claim must be delivered.
func TestPopAutoAckUndecryptableMessageEndsInDeadLetters(t *testing.T) {
	c, q, xID := undecryptableSetup(t)
	msgs, err := q.Pop(ctxT(t), queen.PopOptions{Batch: 10, Partitions: 3, AutoAck: true})
	if err != nil {
		t.Fatalf("Pop: %v", err)
	}
	wantSorted(t, msgs, "a0", "a1", "c0", "b0", "b2")
	wantDeadLetter(t, c, xID, "encryption")
	if got := pop(t, q, queen.PopOptions{Batch: 10, Partitions: 3, AutoAck: true}); len(got) != 0 {
		t.Fatalf("left over: %q", datas(got))
	}
}

// A segment whose blob cannot be decompressed: its messages are
// dead-lettered (without a snapshot: none can be read) and everything else
// is delivered, including later segments of the same partition.
func TestPopCorruptSegmentIsDeadLetteredAndOthersDelivered(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: time.Hour})
	pushN(t, q, "a", "a", 1)
	pushN(t, q, "bad", "m", 2) // one segment: offsets 0 and 1
	push(t, q, queen.Item{Partition: "bad", Data: []byte("m2")})
	tag, err := c.Pool().Exec(ctxT(t), "UPDATE "+pgx.Identifier{c.Schema(), "segments"}.Sanitize()+
		` s SET blob = '\x01deadbeef' FROM `+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
		` p WHERE p.id = s.partition_id AND p.name = 'bad' AND s.base_offset = 0`)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("corrupting the segment: %v, %v", tag, err)
	}
	for _, autoAck := range []bool{false, true} {
		g := fmt.Sprint("auto-ack-", autoAck)
		msgs, err := q.Pop(ctxT(t), queen.PopOptions{Group: g, Batch: 10, Partitions: 2, AutoAck: autoAck})
		if err != nil {
			t.Fatalf("%s: Pop: %v", g, err)
		}
		wantSorted(t, msgs, "a0", "m2")
		if !autoAck {
			ackAll(t, msgs)
		}
		if got := pop(t, q, queen.PopOptions{Group: g, Batch: 10, Partitions: 2}); len(got) != 0 {
			t.Fatalf("%s: left over: %q", g, datas(got))
		}
		dl, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{Groups: []string{g}})
		if err != nil {
			t.Fatal(err)
		}
		if len(dl) != 2 || dl[0].Offset != 0 || dl[1].Offset != 1 || dl[0].Partition != "bad" ||
			!strings.Contains(dl[0].Reason, "undecodable") {
			t.Fatalf("%s: dead letters %+v, want offsets 0 and 1 of bad", g, dl)
		}
	}
}

// Consume goes on past a message it cannot decrypt: it is dead-lettered,
// every healthy message is handled once, and nothing loops.
func TestConsumeGoesOnPastAnUndecryptableMessage(t *testing.T) {
	c, q, xID := undecryptableSetup(t)
	var mu sync.Mutex
	var seen []string
	ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
	defer cancel()
	err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Wait: 100 * time.Millisecond}, Concurrency: 2},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, string(m.Data))
			if len(seen) >= 5 {
				cancel()
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	slices.Sort(seen)
	got := fmt.Sprint(seen)
	mu.Unlock()
	if want := fmt.Sprint([]string{"a0", "a1", "b0", "b2", "c0"}); got != want {
		t.Fatalf("handled %s, want %s", got, want)
	}
	wantDeadLetter(t, c, xID, "encryption")
}

// A client without a key cannot read an encrypted queue at all: its pop
// fails with ErrEncryption before claiming anything, so nothing is leased,
// consumed or dead-lettered by the misconfigured consumer.
func TestPopWithoutKeyOnEncryptedQueueClaimsNothing(t *testing.T) {
	c1 := open(t, withKey(testKey(1)))
	q1 := configure(t, c1, "q", queen.QueueOptions{Encryption: true, LeaseTime: time.Hour})
	pushN(t, q1, "", "m", 2)
	keyless := openOn(t, c1)
	for _, autoAck := range []bool{false, true} {
		if _, err := keyless.Queue("q").Pop(ctxT(t), queen.PopOptions{Batch: 10, AutoAck: autoAck}); !errors.Is(err, queen.ErrEncryption) {
			t.Fatalf("Pop without a key (AutoAck %v) = %v, want ErrEncryption", autoAck, err)
		}
	}
	wantData(t, pop(t, q1, queen.PopOptions{Batch: 10}), "m0", "m1")
	if n := countRows(t, c1, "dead_letters"); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
}

// An undecodable run at a cursor's head with an offset inside it settled
// out of order (per-key parallel Consume) is dead-lettered like a
// contiguous one: the cursor moves past it at once. The history checker
// found the partition held until the claim's lease ran out, its later
// messages never delivered to the group.
func TestPopUndecodableRunAroundASettledOffset(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: time.Hour})
	pushN(t, q, "bad", "m", 4) // one segment: offsets 0-3
	if got := pop(t, q, queen.PopOptions{Group: "g", Batch: 1}); len(got) != 1 {
		t.Fatalf("first pop: %d messages", len(got))
	}
	s := pgx.Identifier{c.Schema()}.Sanitize()
	// As a keyed consumer leaves it: offset 1 settled above the cursor,
	// the lease over.
	if _, err := c.Pool().Exec(ctx, "UPDATE "+s+`.consumers SET committed = -1, settled = '{1}', batch_end = NULL,
		lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL WHERE group_name = 'g'`); err != nil {
		t.Fatal(err)
	}
	if tag, err := c.Pool().Exec(ctx, "UPDATE "+s+`.segments x SET blob = '\x01deadbeef' FROM `+s+
		`.partitions p WHERE p.id = x.partition_id AND p.name = 'bad' AND x.base_offset = 0`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("corrupting the segment: %v, %v", tag, err)
	}
	if got := pop(t, q, queen.PopOptions{Group: "g", Batch: 10}); len(got) != 0 {
		t.Fatalf("pop of the corrupt segment delivered %q", datas(got))
	}
	dl, err := q.DeadLetters(ctx, queen.DeadLetterQuery{Groups: []string{"g"}})
	if err != nil {
		t.Fatal(err)
	}
	var offs []int64
	for _, d := range dl {
		offs = append(offs, d.Offset)
	}
	if fmt.Sprint(offs) != "[0 2 3]" {
		t.Fatalf("dead letters at %v, want [0 2 3] (1 was settled)", offs)
	}
	push(t, q, queen.Item{Partition: "bad", Data: []byte("m4")})
	if got := pop(t, q, queen.PopOptions{Group: "g", Batch: 10}); len(got) != 1 || string(got[0].Data) != "m4" {
		t.Fatalf("after the dead letters: %q, want m4 at once", datas(got))
	}
}

// A pop whose claim took only an undecryptable message (dead-lettered, so
// nothing to deliver) claims again: an empty Pop means nothing was left to
// claim, not that the partition it happened to claim first held nothing
// readable. On the Citus layout a claim of several partitions takes one
// worker's, so a Pop of two could claim "bad" alone there.
func TestPopEmptyOnlyWhenNothingClaimableAfterUndecryptable(t *testing.T) {
	c := open(t, withKey(testKey(1)))
	q := configure(t, c, "q", queen.QueueOptions{Encryption: true, LeaseTime: time.Hour})
	push(t, q, queen.Item{Partition: "bad", Data: []byte("x")})
	pid, blob := segmentBlob(t, c, queen.DefaultTenant, "q", "bad", 0)
	f := onlyFrame(t, blob)
	f.Payload[len(f.Payload)-1] ^= 1
	setSegmentBlob(t, c, pid, 0, segment.Compress(nil, frame.Append(nil, &f)))
	push(t, q, queen.Item{Partition: "good", Data: []byte("g0")})
	// Each group picks its first partition on its own (a random point of
	// the ready set): over 12 groups "bad" comes first for some.
	for i := range 12 {
		g := fmt.Sprint("g", i)
		parts := 1 + i%2
		msgs := pop(t, q, queen.PopOptions{Group: g, Batch: 10, Partitions: parts})
		wantData(t, msgs, "g0")
		ackAll(t, msgs)
		if got := pop(t, q, queen.PopOptions{Group: g, Batch: 10, Partitions: parts}); len(got) != 0 {
			t.Fatalf("%s: left over: %q", g, datas(got))
		}
	}
}
