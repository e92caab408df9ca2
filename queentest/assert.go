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

// Expected describes one message RequirePushed expects, as the Item that
// pushed it did: Partition "" is queen.DefaultPartition, where an Item
// without a Partition goes. Any other field left at its zero value is not
// compared: "" for Key and TransactionID, nil for Data and Headers. To
// require an empty payload or no headers, use a non-nil empty value
// ([]byte{}, map[string]string{}).
type Expected struct {
	Partition     string
	Key           string
	TransactionID string
	Data          []byte
	Headers       map[string]string
}

// RequirePushed fails tb (with FailNow) unless q holds exactly the expected
// messages and shows every difference. It compares per partition, as
// queen orders messages: in order within a partition, in any order across
// partitions, so expectations of several partitions may interleave. It
// reads with Queue.Peek, so it leases nothing and moves no cursor, and it
// sees every retained message, consumed or not. With no expectations it
// requires the queue to be empty. Fewer than queen.MaxBatch messages can be
// expected.
func RequirePushed(ctx context.Context, tb testing.TB, q *queen.Queue, expect ...Expected) {
	tb.Helper()
	if len(expect) >= queen.MaxBatch {
		tb.Fatalf("queentest: RequirePushed: %d expectations, at most %d", len(expect), queen.MaxBatch-1)
	}
	want := map[string][]int{} // partition -> indexes into expect, in order
	for i, w := range expect {
		p := partitionOf(w)
		want[p] = append(want[p], i)
	}
	got := map[string][]*queen.Message{}
	for p, idx := range want {
		// One more than expected shows an unexpected extra message.
		msgs, err := q.Peek(ctx, queen.PeekOptions{Partition: p, Limit: len(idx) + 1})
		if err != nil {
			tb.Fatalf("queentest: RequirePushed: %v", err)
		}
		got[p] = msgs
	}
	// Messages of partitions nothing is expected in: when every expected
	// partition holds what is expected, one more than expected is one of
	// them.
	all, err := q.Peek(ctx, queen.PeekOptions{Limit: len(expect) + 1})
	if err != nil {
		tb.Fatalf("queentest: RequirePushed: %v", err)
	}
	for _, m := range all {
		if _, ok := want[m.Partition]; !ok {
			got[m.Partition] = append(got[m.Partition], m)
		}
	}
	if diff := pushedDiff(got, want, expect); diff != "" {
		tb.Fatalf("queentest: queue %q does not hold the expected messages (%d expected):\n%s", q.Name(), len(expect), diff)
	}
}

func partitionOf(w Expected) string {
	if w.Partition == "" {
		return queen.DefaultPartition
	}
	return w.Partition
}

// pushedDiff returns, per partition in byte order of the names, one line
// per message and expectation, marked where they differ, or "" when all
// match.
func pushedDiff(got map[string][]*queen.Message, want map[string][]int, expect []Expected) string {
	var b strings.Builder
	bad := false
	parts := slices.Sorted(maps.Keys(got))
	for p := range want {
		if _, ok := got[p]; !ok {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	for _, p := range parts {
		g, w := got[p], want[p]
		fmt.Fprintf(&b, "  partition %q:\n", p)
		for i := range max(len(g), len(w)) {
			switch {
			case i >= len(w):
				bad = true
				fmt.Fprintf(&b, "    unexpected:  %s\n", describe(g[i]))
			case i >= len(g):
				bad = true
				fmt.Fprintf(&b, "    #%d missing:  %s\n", w[i], describeWant(expect[w[i]]))
			default:
				if d := mismatch(g[i], expect[w[i]]); len(d) > 0 {
					bad = true
					fmt.Fprintf(&b, "    #%d differs:  %s\n", w[i], describe(g[i]))
					for _, l := range d {
						fmt.Fprintf(&b, "        %s\n", l)
					}
				} else {
					fmt.Fprintf(&b, "    #%d ok:       %s\n", w[i], describe(g[i]))
				}
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
	s := fmt.Sprintf("offset %d txn %q", m.Offset, m.TransactionID)
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
// WorkWith works as a named consumer group or on one partition.
func Work(ctx context.Context, tb testing.TB, q *queen.Queue, fn func(context.Context, *queen.Message) error) WorkResult {
	tb.Helper()
	return WorkWith(ctx, tb, q, WorkOptions{}, fn)
}

// WorkOptions choose what Work pops.
type WorkOptions struct {
	// Group is the consumer group to pop as, subscribed as a Consume of
	// the group with default options would be (SubscribeAll). Defaults to
	// "": queue mode.
	Group string
	// Partition restricts the pop to one partition. Defaults to "": any.
	Partition string
}

// WorkWith is Work as o says: as a consumer group, or on one partition.
func WorkWith(ctx context.Context, tb testing.TB, q *queen.Queue, o WorkOptions, fn func(context.Context, *queen.Message) error) WorkResult {
	tb.Helper()
	msgs, err := q.Pop(ctx, queen.PopOptions{Group: o.Group, Partition: o.Partition})
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
