package queen_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
)

// keys maps each popped message's data to its key.
func keys(msgs []*queen.Message) map[string]string {
	out := make(map[string]string, len(msgs))
	for _, m := range msgs {
		out[string(m.Data)] = m.Key
	}
	return out
}

func wantKeys(t testing.TB, msgs []*queen.Message, want map[string]string) {
	t.Helper()
	if got := keys(msgs); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("keys by data = %v, want %v", got, want)
	}
}

// popToEmpty pops (o with AutoAck) until a pop comes back empty: on the
// distributed layout a claim of several partitions takes one worker's.
// A message delivered twice fails the test.
func popToEmpty(t testing.TB, q *queen.Queue, o queen.PopOptions) []*queen.Message {
	t.Helper()
	o.AutoAck = true
	var all []*queen.Message
	seen := map[uuid.UUID]bool{}
	for range 50 {
		msgs := pop(t, q, o)
		if len(msgs) == 0 {
			return all
		}
		for _, m := range msgs {
			if seen[m.ID] {
				t.Fatalf("%s/%d (%s) delivered twice", m.Partition, m.Offset, m.ID)
			}
			seen[m.ID] = true
		}
		all = append(all, msgs...)
	}
	t.Fatal("no empty pop in 50")
	return nil
}

// A key comes back on Pop and on Consume, whether the item was routed to a
// lane or named its own partition; an item without one has Key "".
func TestKeyRoundTripPopAndConsume(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	push(t, q,
		queen.Item{Data: []byte("routed"), Key: "customer-42"},
		queen.Item{Data: []byte("own"), Key: "ключ", Partition: "p"},
		queen.Item{Data: []byte("none")})
	msgs := pop(t, q, queen.PopOptions{Batch: 10, Partitions: 10})
	wantKeys(t, msgs, map[string]string{"routed": "customer-42", "own": "ключ", "none": ""})
	ackAll(t, msgs)

	push(t, q, queen.Item{Data: []byte("c0"), Key: "k0"}, queen.Item{Data: []byte("c1"), Key: "k1", Partition: "p"})
	var mu sync.Mutex
	got := map[string]string{}
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Wait: 100 * time.Millisecond}},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got[string(m.Data)] = m.Key
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 })
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Consume: %v", err)
	}
	if fmt.Sprint(got) != fmt.Sprint(map[string]string{"c0": "k0", "c1": "k1"}) {
		t.Fatalf("Consume keys = %v", got)
	}
}

// The lane of a key is "lane-<XXH3_64(key) mod Lanes>". These values were
// checked against the reference C implementation (libxxhash XXH3_64bits):
//
//	"a"           e6c632b61e964e1f
//	"customer-42" f40925ac7f7b5e61
//	"order-1001"  af6a59062821be5f
//	"ключ"        9a137c08c1e55ede
//	"x"           eaf06c6480b2cd11
func TestKeyLaneRouting(t *testing.T) {
	c := open(t)
	cases := []struct {
		lanes int
		want  map[string]string // key -> partition
	}{
		{0, map[string]string{"a": "lane-31", "customer-42": "lane-33", "order-1001": "lane-31", "ключ": "lane-30", "x": "lane-17"}},
		{8, map[string]string{"a": "lane-7", "customer-42": "lane-1", "order-1001": "lane-7", "ключ": "lane-6", "x": "lane-1"}},
		{1000, map[string]string{"a": "lane-719", "customer-42": "lane-433", "order-1001": "lane-239", "ключ": "lane-918", "x": "lane-425"}},
		{1, map[string]string{"a": "lane-0", "x": "lane-0"}},
	}
	for _, tc := range cases {
		q := configure(t, c, fmt.Sprintf("lanes-%d", tc.lanes), queen.QueueOptions{Lanes: tc.lanes})
		var items []queen.Item
		for k := range tc.want {
			items = append(items, queen.Item{Key: k, Data: []byte(k)})
		}
		for i, r := range push(t, q, items...) {
			if want := tc.want[items[i].Key]; r.Partition != want {
				t.Fatalf("Lanes %d: key %q went to %q, want %q", tc.lanes, items[i].Key, r.Partition, want)
			}
		}
		msgs := pop(t, q, queen.PopOptions{Batch: 100, Partitions: 100, AutoAck: true})
		for len(msgs) < len(items) && onLayout() {
			// A claim there takes one worker's partitions at a time.
			more := pop(t, q, queen.PopOptions{Batch: 100, Partitions: 100, AutoAck: true})
			if len(more) == 0 {
				break
			}
			msgs = append(msgs, more...)
		}
		if len(msgs) != len(items) {
			t.Fatalf("Lanes %d: popped %d of %d", tc.lanes, len(msgs), len(items))
		}
		for _, m := range msgs {
			if m.Partition != tc.want[m.Key] {
				t.Fatalf("Lanes %d: key %q stored in %q, want %q", tc.lanes, m.Key, m.Partition, tc.want[m.Key])
			}
		}
	}
	// A Partition wins over the lane; no key keeps "Default".
	q := c.Queue("lanes-0")
	res := push(t, q, queen.Item{Key: "a", Partition: "mine"}, queen.Item{Data: []byte("plain")})
	if res[0].Partition != "mine" || res[1].Partition != queen.DefaultPartition {
		t.Fatalf("partitions %q, %q; want mine, %s", res[0].Partition, res[1].Partition, queen.DefaultPartition)
	}
}

// Messages of one key keep their push order within their lane, across
// calls and with other keys interleaved.
func TestKeyOrderWithinLane(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{Lanes: 4})
	const nKeys, rounds = 12, 10
	for r := range rounds {
		var items []queen.Item
		for k := range nKeys {
			items = append(items, queen.Item{Key: fmt.Sprintf("k%d", k), Data: fmt.Appendf(nil, "%d", r)},
				queen.Item{Key: fmt.Sprintf("k%d", k), Data: fmt.Appendf(nil, "%d.5", r)})
		}
		push(t, q, items...)
	}
	seq := map[string][]string{}
	lane := map[string]string{}
	for {
		msgs := pop(t, q, queen.PopOptions{Batch: 1000, Partitions: 10, AutoAck: true})
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			if l, ok := lane[m.Key]; ok && l != m.Partition {
				t.Fatalf("key %s in %s and %s", m.Key, l, m.Partition)
			}
			lane[m.Key] = m.Partition
			seq[m.Key] = append(seq[m.Key], string(m.Data))
		}
	}
	var want []string
	for r := range rounds {
		want = append(want, fmt.Sprint(r), fmt.Sprintf("%d.5", r))
	}
	for k := range nKeys {
		key := fmt.Sprintf("k%d", k)
		if fmt.Sprint(seq[key]) != fmt.Sprint(want) {
			t.Fatalf("key %s delivered %v, want %v", key, seq[key], want)
		}
	}
}

// PushTx and Client.Tx keep the key.
func TestKeyPushTx(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	ctx := ctxT(t)
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := q.PushTx(ctx, tx, []queen.Item{{Data: []byte("tx"), Key: "customer-42"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if res[0].Partition != "lane-33" {
		t.Fatalf("PushTx routed to %q, want lane-33", res[0].Partition)
	}
	if err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Push("q", []queen.Item{{Data: []byte("ctx"), Key: "x", Partition: "p"}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	wantKeys(t, pop(t, q, queen.PopOptions{Batch: 10, Partitions: 10, AutoAck: true}),
		map[string]string{"tx": "customer-42", "ctx": "x"})
}

// A keyed push in maintenance mode is spooled with its key and stored with
// it by the replay, in its lane.
func TestKeySurvivesSpool(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("before")}) // the queue exists
	setMaintenance(t, c, true)
	res := push(t, q, queen.Item{Data: []byte("s0"), Key: "customer-42"}, queen.Item{Data: []byte("s1"), Key: "a", Partition: "p"})
	for i, r := range res {
		if r.Status != queen.Buffered {
			t.Fatalf("item %d: %s, want buffered in maintenance mode", i, r.Status)
		}
	}
	setMaintenance(t, c, false)
	waitFor(t, 10*time.Second, "the spool to drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	msgs := pop(t, q, queen.PopOptions{Batch: 10, Partitions: 10, AutoAck: true})
	wantKeys(t, msgs, map[string]string{"before": "", "s0": "customer-42", "s1": "a"})
	for _, m := range msgs {
		if string(m.Data) == "s0" && m.Partition != "lane-33" {
			t.Fatalf("replayed keyed item stored in %q, want lane-33", m.Partition)
		}
	}
}

// FailureSkip re-enqueues a failed message with its key (the frame is
// rebuilt in SQL); on an encrypted queue the copy still decrypts, which it
// would not if the key (authenticated) were lost.
func TestKeySurvivesFailureSkipRequeue(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypted=%v", enc), func(t *testing.T) {
			c := open(t, withKey(testKey(7)))
			q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5, Encryption: enc,
				RetryBackoff: noBackoff})
			push(t, q, queen.Item{Data: []byte("m0"), Key: "k"}, queen.Item{Data: []byte("m1"), Key: "k"})
			msgs := pop(t, q, queen.PopOptions{})
			wantData(t, msgs, "m0")
			if err := msgs[0].Fail(ctxT(t), errors.New("boom")); err != nil {
				t.Fatal(err)
			}
			msgs = pop(t, q, queen.PopOptions{Batch: 10})
			wantData(t, msgs, "m1", "m0")
			wantKeys(t, msgs, map[string]string{"m0": "k", "m1": "k"})
			if msgs[1].Attempt != 2 {
				t.Fatalf("re-enqueued copy Attempt = %d, want 2", msgs[1].Attempt)
			}
			ackAll(t, msgs)
		})
	}
}

// Dead letters keep the key, and an encrypted one still opens with it.
func TestKeyDeadLetter(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypted=%v", enc), func(t *testing.T) {
			c := open(t, withKey(testKey(8)))
			q := configure(t, c, "q", queen.QueueOptions{Encryption: enc, DeadLetter: true})
			push(t, q, queen.Item{Data: []byte("d"), Key: "customer-42"})
			msgs := pop(t, q, queen.PopOptions{})
			if err := msgs[0].DeadLetter(ctxT(t), errors.New("poison")); err != nil {
				t.Fatal(err)
			}
			dl := deadLetters(t, q)
			if len(dl) != 1 || dl[0].Key != "customer-42" || string(dl[0].Data) != "d" || dl[0].Partition != "lane-33" {
				t.Fatalf("dead letters %+v, want d with key customer-42 in lane-33", dl)
			}
		})
	}
}

// On an encrypted queue the key is stored in the clear (routing metadata)
// but authenticated: a frame whose key was altered or removed does not
// decrypt, so the message is dead-lettered as undecodable instead of being
// delivered under another key.
func TestKeyEncryptedAuthenticated(t *testing.T) {
	c := open(t, withKey(testKey(9)))
	q := configure(t, c, "q", queen.QueueOptions{Encryption: true})
	for i, tamper := range []string{"customer-43", ""} {
		part := fmt.Sprintf("p%d", i)
		push(t, q, queen.Item{Data: []byte("secret"), Key: "customer-42", Partition: part})
		pid, blob := segmentBlob(t, c, c.Tenant(), "q", part, 0)
		f := onlyFrame(t, blob)
		if f.Key != "customer-42" || f.Flags&frame.FlagEncrypted == 0 || strings.Contains(string(f.Payload), "secret") {
			t.Fatalf("stored frame key %q flags %#x: want the key in the clear and the payload encrypted", f.Key, f.Flags)
		}
		f.Key = tamper
		setSegmentBlob(t, c, pid, 0, segment.Compress(nil, frame.Append(nil, &f)))
		if msgs := pop(t, q, queen.PopOptions{Partition: part}); len(msgs) != 0 {
			t.Fatalf("key %q: tampered message delivered: %q", tamper, datas(msgs))
		}
		if r := deadReason(t, c, q, part); !strings.Contains(r, "undecodable") || !strings.Contains(r, "encryption") {
			t.Fatalf("key %q: dead-letter reason %q, want undecodable for its encryption error", tamper, r)
		}
	}
}

// A bad key fails the whole call, Push and PushTx alike, with
// ErrInvalidName, and nothing is written, not even the good items.
func TestBadKeysWriteNothing(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	bad := map[string]string{
		"256 bytes":     strings.Repeat("k", 256),
		"invalid UTF-8": "k\xff",
		"NUL":           "k\x00k",
	}
	for name, key := range bad {
		items := []queen.Item{{Data: []byte("good"), Key: "fine"}, {Data: []byte("bad"), Key: key}}
		if _, err := q.Push(ctxT(t), items); !errors.Is(err, queen.ErrInvalidName) {
			t.Fatalf("%s: Push = %v, want ErrInvalidName", name, err)
		}
		err := pgx.BeginFunc(ctxT(t), c.Pool(), func(tx pgx.Tx) error {
			_, err := q.PushTx(ctxT(t), tx, items)
			return err
		})
		if !errors.Is(err, queen.ErrInvalidName) {
			t.Fatalf("%s: PushTx = %v, want ErrInvalidName", name, err)
		}
	}
	if n := countRows(t, c, "segments"); n != 0 {
		t.Fatalf("%d segments stored by rejected pushes", n)
	}
	if n := countRows(t, c, "queues"); n != 0 {
		t.Fatalf("%d queues created by rejected pushes", n)
	}
	// 255 bytes is the limit, and fine.
	push(t, q, queen.Item{Key: strings.Repeat("k", queen.MaxKeyLen)})
}

// Lanes: negative is an error; the count can change until the queue
// stores a keyed message, and from then on only the same count is
// accepted (ErrLanesFixed), changing nothing.
func TestLanesConfigure(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	if err := q.Configure(ctxT(t), queen.QueueOptions{Lanes: -1}); err == nil || !strings.Contains(err.Error(), "Lanes") {
		t.Fatalf("Configure(Lanes: -1) = %v, want an error naming Lanes", err)
	}
	configure(t, c, "q", queen.QueueOptions{Lanes: 16})
	push(t, q, queen.Item{Data: []byte("unkeyed")}, queen.Item{Data: []byte("own"), Partition: "p"})
	configure(t, c, "q", queen.QueueOptions{Lanes: 8}) // no keyed message yet
	push(t, q, queen.Item{Data: []byte("k"), Key: "customer-42"})
	err := q.Configure(ctxT(t), queen.QueueOptions{Lanes: 16, RetryLimit: 9})
	if !errors.Is(err, queen.ErrLanesFixed) {
		t.Fatalf("Configure(Lanes: 16) after a keyed push = %v, want ErrLanesFixed", err)
	}
	if err := q.Configure(ctxT(t), queen.QueueOptions{}); !errors.Is(err, queen.ErrLanesFixed) {
		t.Fatalf("Configure with the default lanes after a keyed push = %v, want ErrLanesFixed", err)
	}
	var lanes, retry int
	if err := c.Pool().QueryRow(ctxT(t), "SELECT lanes, retry_limit FROM "+pgx.Identifier{c.Schema(), "queues"}.Sanitize()+
		" WHERE name = 'q'").Scan(&lanes, &retry); err != nil {
		t.Fatal(err)
	}
	if lanes != 8 || retry != 3 {
		t.Fatalf("refused Configure changed the queue: lanes %d retry %d", lanes, retry)
	}
	configure(t, c, "q", queen.QueueOptions{Lanes: 8, RetryLimit: 9}) // the same count is fine
	// A key with its own Partition freezes the count too.
	q2 := c.Queue("q2")
	push(t, q2, queen.Item{Key: "a", Partition: "p"})
	if err := q2.Configure(ctxT(t), queen.QueueOptions{Lanes: 2}); !errors.Is(err, queen.ErrLanesFixed) {
		t.Fatalf("Configure(Lanes: 2) after a keyed push with a partition = %v, want ErrLanesFixed", err)
	}
}

// A client whose cached settings still say 64 lanes, after another client
// configured 8 before any keyed push, never stores a keyed message in the
// lane 64 would give: the database refuses the stale count and the client
// routes again with 8. Push, PushTx and the spool replay alike.
func TestLanesStaleCacheReroutes(t *testing.T) {
	c1, c2, _ := openPair(t)
	ctx := ctxT(t)
	for _, via := range []string{"Push", "PushTx", "spool"} {
		name := "q-" + via
		q1 := c1.Queue(name)
		push(t, q1, queen.Item{Data: []byte("warm")}) // c1 caches 64 lanes
		if !queen.MetaCached(c1, name) {
			t.Fatalf("%s: c1 did not cache the queue's settings", via)
		}
		configure(t, c2, name, queen.QueueOptions{Lanes: 8})
		before := queen.Rerouted(c1)
		item := queen.Item{Data: []byte("k"), Key: "customer-42"} // lane-33 of 64, lane-1 of 8
		var res []queen.PushResult
		switch via {
		case "Push":
			res = push(t, q1, item)
		case "PushTx":
			err := pgx.BeginFunc(ctx, c1.Pool(), func(tx pgx.Tx) error {
				var err error
				res, err = q1.PushTx(ctx, tx, []queen.Item{item})
				return err
			})
			if err != nil {
				t.Fatalf("PushTx: %v", err)
			}
		case "spool":
			setMaintenance(t, c1, true)
			res = push(t, q1, item)
			if res[0].Status != queen.Buffered || res[0].Partition != "lane-33" {
				t.Fatalf("spooled with %s to %q, want buffered to the stale lane-33", res[0].Status, res[0].Partition)
			}
			setMaintenance(t, c1, false)
			waitFor(t, 10*time.Second, "the spool to drain", func() bool { return c1.SpoolStats().PendingRecords == 0 })
		}
		if via != "spool" && (res[0].Status != queen.Queued || res[0].Partition != "lane-1") {
			t.Fatalf("%s: %s to %q, want queued to lane-1", via, res[0].Status, res[0].Partition)
		}
		if queen.Rerouted(c1) == before {
			t.Fatalf("%s: nothing was routed again: the cache was not stale", via)
		}
		msgs := popToEmpty(t, c2.Queue(name), queen.PopOptions{Batch: 10, Partitions: 10})
		wantKeys(t, msgs, map[string]string{"warm": "", "k": "customer-42"})
		for _, m := range msgs {
			if m.Key != "" && m.Partition != "lane-1" {
				t.Fatalf("%s: keyed message stored in %q, want lane-1", via, m.Partition)
			}
		}
		if err := c2.Queue(name).Configure(ctx, queen.QueueOptions{Lanes: 64}); !errors.Is(err, queen.ErrLanesFixed) {
			t.Fatalf("%s: Configure after the keyed push = %v, want ErrLanesFixed", via, err)
		}
	}
}
