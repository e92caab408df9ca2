package queen_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// scribble overwrites a message's Data in place, as a handler reusing the
// buffer would.
func scribble(m *queen.Message) {
	for i := range m.Data {
		m.Data[i] = '#'
	}
}

// Message.Data belongs to the caller: writing to it changes neither the
// dead-letter snapshot, nor the copy the skip policy re-enqueues, nor what
// another group's pop of the same (cached) segment returns.
func TestPopMutatingDataChangesNothingElse(t *testing.T) {
	c := open(t)

	dlq := configure(t, c, "dl", queen.QueueOptions{DeadLetter: true})
	pushN(t, dlq, "", "orig", 1)
	m := pop(t, dlq, queen.PopOptions{})[0]
	scribble(m)
	if err := m.DeadLetter(ctxT(t), errors.New("bad")); err != nil {
		t.Fatal(err)
	}
	dl, err := dlq.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dl) != 1 || string(dl[0].Data) != "orig0" {
		t.Fatalf("dead letter after the handler wrote to Data: %+v, %v", dl, err)
	}

	skip := configure(t, c, "skip", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5, RetryBackoff: noBackoff})
	pushN(t, skip, "", "orig", 2)
	m = pop(t, skip, queen.PopOptions{})[0]
	scribble(m)
	if err := m.Fail(ctxT(t), errors.New("again")); err != nil {
		t.Fatal(err)
	}
	msgs := pop(t, skip, queen.PopOptions{Batch: 10})
	wantData(t, msgs, "orig1", "orig0") // the re-enqueued copy last

	shared := c.Queue("shared")
	pushN(t, shared, "", "orig", 3) // one segment, read a message at a time: cached
	for _, g := range []string{"g1", "g2"} {
		m := pop(t, shared, queen.PopOptions{Group: g})[0]
		if string(m.Data) != "orig0" {
			t.Fatalf("group %s got %q, want orig0", g, m.Data)
		}
		scribble(m)
	}
	wantData(t, pop(t, shared, queen.PopOptions{Group: "g3", Batch: 10}), "orig0", "orig1", "orig2")
}

// keptItems are 15 messages with a key, headers and a transaction id each,
// pushed in three segments of five.
func keptItems(t *testing.T, q *queen.Queue) []queen.Item {
	t.Helper()
	var items []queen.Item
	for s := range 3 {
		seg := make([]queen.Item, 5)
		for i := range seg {
			n := s*5 + i
			seg[i] = queen.Item{Partition: "p", Key: fmt.Sprintf("k%d", n%4), TransactionID: fmt.Sprintf("txn-%d", n),
				Headers: map[string]string{"n": fmt.Sprint(n)}, Data: []byte(strings.Repeat(fmt.Sprint(n%10), 10+n))}
		}
		push(t, q, seg...)
		items = append(items, seg...)
	}
	return items
}

// wantKept checks that msgs still hold what items were pushed with.
func wantKept(t *testing.T, msgs []*queen.Message, items []queen.Item) {
	t.Helper()
	if len(msgs) != len(items) {
		t.Fatalf("kept %d messages, want %d", len(msgs), len(items))
	}
	for i, m := range msgs {
		it := items[i]
		if string(m.Data) != string(it.Data) || m.TransactionID != it.TransactionID || m.Key != it.Key ||
			fmt.Sprint(m.Headers) != fmt.Sprint(it.Headers) {
			t.Errorf("offset %d kept Data %q txn %q key %q headers %v, want %q %q %q %v", m.Offset, m.Data, m.TransactionID,
				m.Key, m.Headers, it.Data, it.TransactionID, it.Key, it.Headers)
		}
	}
}

// A message kept after its handler returns keeps its Data, transaction id,
// key and headers as they were while later batches are claimed and decoded,
// and appending to one message's Data never writes into another's.
func TestConsumeKeptMessagesUnchanged(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	items := keptItems(t, q)
	var (
		mu   sync.Mutex
		kept []*queen.Message
	)
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 5, Wait: 100 * time.Millisecond}},
		func(_ context.Context, m *queen.Message) error {
			_ = append(m.Data, "appended past the payload"...)
			mu.Lock()
			defer mu.Unlock()
			kept = append(kept, m)
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return len(kept) >= len(items) })
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	wantKept(t, kept, items)
}

// The same for Pop, with messages of one batch written to: the others, a
// dead letter's snapshot and a later pop of the same segments by another
// group stay as pushed.
func TestPopKeptMessagesUnchanged(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	items := keptItems(t, q)
	var kept []*queen.Message
	for range 3 {
		msgs := pop(t, q, queen.PopOptions{Group: "g1", Batch: 5})
		for _, m := range msgs {
			_ = append(m.Data, "appended past the payload"...)
			ack(t, m)
		}
		kept = append(kept, msgs...)
	}
	wantKept(t, kept, items)

	msgs := pop(t, q, queen.PopOptions{Group: "g2", Batch: 3}) // part of a segment: cached
	scribble(msgs[0])
	scribble(msgs[2])
	if err := msgs[2].DeadLetter(ctxT(t), errors.New("bad")); err != nil {
		t.Fatal(err)
	}
	wantKept(t, msgs[1:2], items[1:2])
	dl, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dl) != 1 || string(dl[0].Data) != string(items[2].Data) || dl[0].Key != items[2].Key ||
		fmt.Sprint(dl[0].Headers) != fmt.Sprint(items[2].Headers) {
		t.Fatalf("dead letter after the handler wrote to Data: %+v, %v", dl, err)
	}
	wantKept(t, pop(t, q, queen.PopOptions{Group: "g3", Batch: 15}), items)

	// A segment read whole (not cached): the dead letter of a message in
	// its middle keeps that message, also after the next segment was
	// decoded.
	msgs = pop(t, q, queen.PopOptions{Group: "g4", Batch: 5})
	wantKept(t, pop(t, q, queen.PopOptions{Group: "g5", Batch: 10}), items[:10])
	scribble(msgs[3])
	if err := msgs[3].DeadLetter(ctxT(t), errors.New("bad")); err != nil {
		t.Fatal(err)
	}
	dl, err = q.DeadLetters(ctxT(t), queen.DeadLetterQuery{Groups: []string{"g4"}})
	if err != nil || len(dl) != 1 || string(dl[0].Data) != string(items[3].Data) || dl[0].Key != items[3].Key ||
		fmt.Sprint(dl[0].Headers) != fmt.Sprint(items[3].Headers) || dl[0].TransactionID != items[3].TransactionID {
		t.Fatalf("dead letter of a segment's fourth message: %+v, %v", dl, err)
	}
}
