package queen_test

import (
	"errors"
	"testing"

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
