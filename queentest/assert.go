package queentest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/e03140bc/queen"
)

// Expected describes one message RequirePushed expects. A field left at
// its zero value is not compared: "" for Partition, Key and TransactionID,
// nil for Data and Headers. To require an empty payload or no headers, use
// a non-nil empty value ([]byte{}, map[string]string{}).
type Expected struct {
	Partition     string
	Key           string
	TransactionID string
	Data          []byte
	Headers       map[string]string
}

// RequirePushed fails tb (with FailNow) unless q holds exactly the expected
// messages, in order, and shows every difference. It reads with Queue.Peek,
// so it leases nothing and moves no cursor, and it sees every retained
// message, consumed or not. The order is Peek's: partitions in byte order
// of their names, each in offset order. With no expectations it requires
// the queue to be empty. At most queen.MaxBatch messages can be expected.
func RequirePushed(ctx context.Context, tb testing.TB, q *queen.Queue, expect ...Expected) {
	tb.Helper()
	if len(expect) >= queen.MaxBatch {
		tb.Fatalf("queentest: RequirePushed: %d expectations, at most %d", len(expect), queen.MaxBatch-1)
	}
	// One more than expected shows an unexpected extra message.
	got, err := q.Peek(ctx, queen.PeekOptions{Limit: len(expect) + 1})
	if err != nil {
		tb.Fatalf("queentest: RequirePushed: %v", err)
	}
	if diff := pushedDiff(got, expect); diff != "" {
		switch {
		case len(got) > len(expect):
			tb.Fatalf("queentest: queue %q holds %d or more messages, want %d:\n%s", q.Name(), len(got), len(expect), diff)
		case len(got) < len(expect):
			tb.Fatalf("queentest: queue %q holds %d messages, want %d:\n%s", q.Name(), len(got), len(expect), diff)
		default:
			tb.Fatalf("queentest: queue %q does not hold the expected messages:\n%s", q.Name(), diff)
		}
	}
}

// pushedDiff returns one line per message, marked where it differs from
// its expectation, or "" when all match.
func pushedDiff(got []*queen.Message, want []Expected) string {
	var b strings.Builder
	bad := false
	for i := range max(len(got), len(want)) {
		switch {
		case i >= len(want):
			bad = true
			fmt.Fprintf(&b, "  #%d unexpected: %s\n", i, describe(got[i]))
		case i >= len(got):
			bad = true
			fmt.Fprintf(&b, "  #%d missing:    %s\n", i, describeWant(want[i]))
		default:
			if d := mismatch(got[i], want[i]); len(d) > 0 {
				bad = true
				fmt.Fprintf(&b, "  #%d differs:    %s\n", i, describe(got[i]))
				for _, l := range d {
					fmt.Fprintf(&b, "      %s\n", l)
				}
			} else {
				fmt.Fprintf(&b, "  #%d ok:         %s\n", i, describe(got[i]))
			}
		}
	}
	if !bad {
		return ""
	}
	return b.String()
}

func mismatch(m *queen.Message, w Expected) []string {
	var d []string
	if w.Partition != "" && m.Partition != w.Partition {
		d = append(d, fmt.Sprintf("partition: got %q, want %q", m.Partition, w.Partition))
	}
	if w.Key != "" && m.Key != w.Key {
		d = append(d, fmt.Sprintf("key: got %q, want %q", m.Key, w.Key))
	}
	if w.TransactionID != "" && m.TransactionID != w.TransactionID {
		d = append(d, fmt.Sprintf("transaction id: got %q, want %q", m.TransactionID, w.TransactionID))
	}
	if w.Data != nil && string(m.Data) != string(w.Data) {
		d = append(d, fmt.Sprintf("data: got %q, want %q", m.Data, w.Data))
	}
	if w.Headers != nil && !maps.Equal(m.Headers, w.Headers) {
		d = append(d, fmt.Sprintf("headers: got %s, want %s", headers(m.Headers), headers(w.Headers)))
	}
	return d
}

func describe(m *queen.Message) string {
	s := fmt.Sprintf("partition %q offset %d txn %q", m.Partition, m.Offset, m.TransactionID)
	if m.Key != "" {
		s += fmt.Sprintf(" key %q", m.Key)
	}
	if len(m.Headers) > 0 {
		s += " headers " + headers(m.Headers)
	}
	return s + fmt.Sprintf(" data %q", m.Data)
}

func describeWant(w Expected) string {
	var parts []string
	if w.Partition != "" {
		parts = append(parts, fmt.Sprintf("partition %q", w.Partition))
	}
	if w.TransactionID != "" {
		parts = append(parts, fmt.Sprintf("txn %q", w.TransactionID))
	}
	if w.Key != "" {
		parts = append(parts, fmt.Sprintf("key %q", w.Key))
	}
	if w.Headers != nil {
		parts = append(parts, "headers "+headers(w.Headers))
	}
	if w.Data != nil {
		parts = append(parts, fmt.Sprintf("data %q", w.Data))
	}
	if len(parts) == 0 {
		return "any message"
	}
	return strings.Join(parts, " ")
}

// headers prints a header map with sorted keys.
func headers(h map[string]string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(h)) {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q: %q", k, h[k])
	}
	b.WriteByte('}')
	return b.String()
}

// Outcome is how Work settled a message.
type Outcome int

const (
	// Empty: there was nothing to pop; the handler did not run.
	Empty Outcome = iota
	// Acked: the handler returned nil and the message was acked.
	Acked
	// Failed: the handler returned an error and the message was failed
	// with it.
	Failed
	// Panicked: the handler panicked and the message was failed with an
	// error wrapping queen.ErrPanic.
	Panicked
)

func (o Outcome) String() string {
	switch o {
	case Empty:
		return "empty"
	case Acked:
		return "acked"
	case Failed:
		return "failed"
	case Panicked:
		return "panicked"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// WorkResult is what Work did.
type WorkResult struct {
	Outcome Outcome
	// Message is the popped message; nil when Outcome is Empty.
	Message *queen.Message
	// Err is the error the message was failed with: the handler's, or for
	// a panic one wrapping queen.ErrPanic. nil when acked or empty.
	Err error
	// Panic is the value the handler panicked with; nil unless Panicked.
	Panic any
}

// Work pops one message from q (queue mode, no wait, the queue's lease
// time), runs fn on it and settles it the way Queue.Consume does: nil acks
// it, an error fails it (charging its retry budget), and a panic is
// recovered and fails it with an error wrapping queen.ErrPanic. It returns
// what happened, Outcome Empty when there was nothing to pop (a failed
// message waiting out its RetryBackoff is not there to pop yet: configure
// the queue with RetryBackoff{Disabled: true} to get it back at once). A failing
// Pop, Ack or Fail fails tb (with FailNow).
//
// Unlike Consume, fn gets ctx itself: no HandlerTimeout, no lease renewal.
func Work(ctx context.Context, tb testing.TB, q *queen.Queue, fn func(context.Context, *queen.Message) error) WorkResult {
	tb.Helper()
	msgs, err := q.Pop(ctx, queen.PopOptions{})
	if err != nil {
		tb.Fatalf("queentest: Work: pop %q: %v", q.Name(), err)
	}
	if len(msgs) == 0 {
		return WorkResult{Outcome: Empty}
	}
	m := msgs[0]
	r := WorkResult{Message: m}
	r.Panic, r.Err = call(ctx, fn, m)
	switch {
	case r.Panic != nil:
		r.Outcome = Panicked
	case r.Err != nil:
		r.Outcome = Failed
	default:
		r.Outcome = Acked
	}
	if r.Err == nil {
		err = m.Ack(ctx)
	} else {
		err = m.Fail(ctx, r.Err)
	}
	if err != nil {
		tb.Fatalf("queentest: Work: settle %s of partition %q offset %d: %v", r.Outcome, m.Partition, m.Offset, err)
	}
	return r
}

// call runs fn, turning a panic into an error as Consume does.
func call(ctx context.Context, fn func(context.Context, *queen.Message) error, m *queen.Message) (p any, err error) {
	panicked := true
	defer func() {
		if panicked {
			p = recover()
			if p == nil {
				// panic(nil) is a *runtime.PanicNilError since Go 1.21; a
				// Goexit (tb.FailNow in fn) is not a panic.
				return
			}
			err = fmt.Errorf("%w: %v", queen.ErrPanic, p)
		}
	}()
	err = fn(ctx, m)
	panicked = false
	return nil, err
}
