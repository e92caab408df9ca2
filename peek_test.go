package queen_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen"
)

func peek(t testing.TB, q *queen.Queue, o queen.PeekOptions) []*queen.Message {
	t.Helper()
	msgs, err := q.Peek(ctxT(t), o)
	if err != nil {
		t.Fatalf("Peek(%+v): %v", o, err)
	}
	return msgs
}

// where lists "partition/offset:data" per message.
func where(msgs []*queen.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = fmt.Sprintf("%s/%d:%s", m.Partition, m.Offset, m.Data)
	}
	return out
}

func wantWhere(t testing.TB, msgs []*queen.Message, want ...string) {
	t.Helper()
	if got := where(msgs); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// Peek returns every field Pop would, leases nothing and moves no cursor:
// a pop after it still gets the same messages, at attempt 1.
func TestPeekReadsWithoutConsuming(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	res := push(t, q,
		queen.Item{Partition: "p", TransactionID: "t0", Key: "k", Headers: map[string]string{"h": "v"}, Data: []byte("a")},
		queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("b")},
	)
	got := peek(t, q, queen.PeekOptions{Partition: "p"})
	if len(got) != 2 {
		t.Fatalf("Peek returned %d messages, want 2", len(got))
	}
	m := got[0]
	if m.ID != res[0].MessageID || m.TransactionID != "t0" || m.Key != "k" || m.Headers["h"] != "v" || len(m.Headers) != 1 ||
		string(m.Data) != "a" || m.Queue != "q" || m.Partition != "p" || m.Offset != 0 || m.CreatedAt.IsZero() {
		t.Fatalf("peeked %+v, want push result %+v with its key, headers and data", m, res[0])
	}
	if m.LeaseID != "" || m.Attempt != 0 || !m.LeaseExpiresAt.IsZero() {
		t.Fatalf("peeked message carries a lease: %+v", m)
	}
	if got[1].TransactionID != "t1" || got[1].Offset != 1 || got[1].Headers != nil || got[1].Key != "" {
		t.Fatalf("second peeked message %+v", got[1])
	}
	if err := m.Ack(ctxT(t)); !errors.Is(err, queen.ErrUnknownMessage) {
		t.Fatalf("Ack of a peeked message = %v, want ErrUnknownMessage", err)
	}
	if err := m.Fail(ctxT(t), errors.New("x")); !errors.Is(err, queen.ErrUnknownMessage) {
		t.Fatalf("Fail of a peeked message = %v, want ErrUnknownMessage", err)
	}
	// A second peek sees the same; a pop is not blocked by a lease.
	wantWhere(t, peek(t, q, queen.PeekOptions{}), "p/0:a", "p/1:b")
	msgs := pop(t, q, queen.PopOptions{Batch: 10})
	wantData(t, msgs, "a", "b")
	if msgs[0].Attempt != 1 {
		t.Fatalf("pop after peek: attempt %d, want 1", msgs[0].Attempt)
	}
	ack(t, msgs[1])
	// Consumed messages are still retained, so Peek still reads them.
	wantWhere(t, peek(t, q, queen.PeekOptions{}), "p/0:a", "p/1:b")
}

// Without a Partition, Peek reads partitions in byte order of their names,
// each in offset order, across segments, from From, up to Limit in all.
func TestPeekOrderFromAndLimit(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	// "B" sorts before "a" in byte order (not in most collations).
	push(t, q, queen.Item{Partition: "a", Data: []byte("a0")}, queen.Item{Partition: "a", Data: []byte("a1")})
	push(t, q, queen.Item{Partition: "B", Data: []byte("B0")})
	push(t, q, queen.Item{Partition: "a", Data: []byte("a2")}) // a second segment
	push(t, q, queen.Item{Partition: "B", Data: []byte("B1")}, queen.Item{Partition: "B", Data: []byte("B2")})

	wantWhere(t, peek(t, q, queen.PeekOptions{}), "B/0:B0", "B/1:B1", "B/2:B2", "a/0:a0", "a/1:a1", "a/2:a2")
	wantWhere(t, peek(t, q, queen.PeekOptions{Limit: 4}), "B/0:B0", "B/1:B1", "B/2:B2", "a/0:a0")
	wantWhere(t, peek(t, q, queen.PeekOptions{From: 1}), "B/1:B1", "B/2:B2", "a/1:a1", "a/2:a2")
	wantWhere(t, peek(t, q, queen.PeekOptions{From: 2, Limit: 1}), "B/2:B2")
	wantWhere(t, peek(t, q, queen.PeekOptions{Partition: "a", From: 1}), "a/1:a1", "a/2:a2")
	wantWhere(t, peek(t, q, queen.PeekOptions{Partition: "a", From: 2}), "a/2:a2")
	wantWhere(t, peek(t, q, queen.PeekOptions{Partition: "a", From: 1, Limit: 1}), "a/1:a1")
	wantWhere(t, peek(t, q, queen.PeekOptions{Partition: "a", From: 3}))
	wantWhere(t, peek(t, q, queen.PeekOptions{Partition: "none"}))
	wantWhere(t, peek(t, c.Queue("never-pushed"), queen.PeekOptions{}))
}

// The default limit applies when Limit is 0, also within one segment.
func TestPeekDefaultLimit(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "p", "m", queen.DefaultPeekLimit+5)
	got := peek(t, q, queen.PeekOptions{})
	if len(got) != queen.DefaultPeekLimit || got[len(got)-1].Offset != queen.DefaultPeekLimit-1 {
		t.Fatalf("Peek returned %d messages, want the first %d", len(got), queen.DefaultPeekLimit)
	}
	if got := peek(t, q, queen.PeekOptions{Limit: queen.DefaultPeekLimit + 10}); len(got) != queen.DefaultPeekLimit+5 {
		t.Fatalf("Peek with a larger limit returned %d messages, want all %d", len(got), queen.DefaultPeekLimit+5)
	}
}

func TestPeekBadInput(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("x")})
	for _, tc := range []struct {
		name string
		q    *queen.Queue
		o    queen.PeekOptions
		is   error
	}{
		{"negative From", q, queen.PeekOptions{From: -1}, nil},
		{"negative Limit", q, queen.PeekOptions{Limit: -1}, nil},
		{"Limit over MaxBatch", q, queen.PeekOptions{Limit: queen.MaxBatch + 1}, nil},
		{"bad partition", q, queen.PeekOptions{Partition: "a\x00b"}, queen.ErrInvalidName},
		{"bad queue", c.Queue(""), queen.PeekOptions{}, queen.ErrInvalidName},
	} {
		msgs, err := tc.q.Peek(ctxT(t), tc.o)
		if err == nil || msgs != nil {
			t.Errorf("%s: Peek = %d messages, %v; want an error", tc.name, len(msgs), err)
			continue
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: Peek error %v, want %v", tc.name, err, tc.is)
		}
	}
}

// Encrypted payloads come back decrypted with the client's key; a client
// without the key gets ErrEncryption, as from Pop.
func TestPeekEncrypted(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = key })
	q := configure(t, c, "secret", queen.QueueOptions{Encryption: true})
	push(t, q, queen.Item{Partition: "p", Key: "k", Headers: map[string]string{"a": "b"}, Data: []byte("plain")})
	got := peek(t, q, queen.PeekOptions{})
	wantWhere(t, got, "p/0:plain")
	if got[0].Key != "k" || got[0].Headers["a"] != "b" {
		t.Fatalf("peeked %+v, want key and headers", got[0])
	}

	keyless := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
	if _, err := keyless.Queue("secret").Peek(ctxT(t), queen.PeekOptions{}); !errors.Is(err, queen.ErrEncryption) {
		t.Fatalf("Peek without the key = %v, want ErrEncryption", err)
	}
	other := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema(); cfg.EncryptionKey = bytes.Repeat([]byte{8}, 32) })
	if _, err := other.Queue("secret").Peek(ctxT(t), queen.PeekOptions{}); !errors.Is(err, queen.ErrEncryption) {
		t.Fatalf("Peek with another key = %v, want ErrEncryption", err)
	}
}

// A corrupt segment fails the peek with an error instead of being skipped
// or dead-lettered: Peek changes nothing.
func TestPeekCorruptSegment(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("x")})
	pid, _ := segmentBlob(t, c, queen.DefaultTenant, "q", "p", 0)
	setSegmentBlob(t, c, pid, 0, []byte("not a segment"))
	if msgs, err := q.Peek(ctxT(t), queen.PeekOptions{}); err == nil {
		t.Fatalf("Peek of a corrupt segment = %q, want an error", datas(msgs))
	}
	dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dls) != 0 {
		t.Fatalf("after Peek: dead letters %v, %v; want none", dls, err)
	}
}

// Peek sees only its own tenant's queue of that name.
func TestPeekTenant(t *testing.T) {
	c := open(t)
	other := c.WithTenant(uuid.Must(uuid.NewV4()))
	push(t, c.Queue("q"), queen.Item{Partition: "p", Data: []byte("mine")})
	push(t, other.Queue("q"), queen.Item{Partition: "p", Data: []byte("theirs")})
	wantWhere(t, peek(t, c.Queue("q"), queen.PeekOptions{}), "p/0:mine")
	wantWhere(t, peek(t, other.Queue("q"), queen.PeekOptions{}), "p/0:theirs")
}

// Peek after Close fails with ErrClosed.
func TestPeekClosed(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	if err := c.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Peek(ctxT(t), queen.PeekOptions{}); !errors.Is(err, queen.ErrClosed) {
		t.Fatalf("Peek after Close = %v, want ErrClosed", err)
	}
}

// Peek shows what is stored, also messages no pop delivers yet.
func TestPeekDelayed(t *testing.T) {
	c := open(t)
	q := configure(t, c, "later", queen.QueueOptions{DelayedProcessing: time.Hour})
	push(t, q, queen.Item{Partition: "p", Data: []byte("x")})
	if got := pop(t, q, queen.PopOptions{}); len(got) != 0 {
		t.Fatalf("Pop of a delayed message returned %q", datas(got))
	}
	wantWhere(t, peek(t, q, queen.PeekOptions{}), "p/0:x")
}
