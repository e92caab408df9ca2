package history

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Recorded by the "keyback" generator (gen_keyback_test.go) on queues with
// a HoldWait: a "consume" call spans one Consume of Queue and Group (its
// completion when it returned); pops and handlers carry their messages'
// keys (Event.Keys).

// holdBound is how long a message must have waited, with a Consume of its
// group running throughout and no database restart near (holdFaults), for
// held to call it held back: past a batch and a lease, which the
// generator keeps at two seconds.
const holdBound = 3 * time.Second

// holdFaults are the nemesis's faults that stall every consumer of a
// queue: a message held across one, or up to holdAfter after it, is not
// judged. The generator's consumers have a client of their own, so a
// fault on another client's pool does not reach them.
var holdFaults = []string{"restart"}

// holdAfter is how long after a fault a Consume may still be backing off
// its failing claims (its backoff's cap, dispatch.BackoffMax).
const holdAfter = 5 * time.Second

// held judges what a failure may hold back on a queue with a HoldWait
// (its RetryBackoff, fixed): under FailurePause with KeyConcurrency only
// the failed message's key waits, so another key's message of the lane
// is not held back (key-stalled); under FailureSkip the failed message
// goes to the tail and nothing waits behind it (skip-stalled). A message
// B of the failed message's partition, less than one Batch of a Consume
// of the group above it (how far other keys run ahead of a waiting key
// is bounded, see DESIGN.md; one Batch is within it), that was not delivered to the group before the failure,
// from the later of the failure and B's Queued push on, must be
// delivered within holdBound, or the failed message delivered again
// within it (which ends what the failure can hold back), while that
// Consume runs throughout (and no holdFaults fault is near, nor a
// Consume settle of the partition refused as lease lost: the partition
// then waits for that lease's expiry); a key with a failure of its own
// within HoldWait before is not judged.
func (c *checker) held(ops []*Op) {
	type qg struct{ queue, group string }
	type del struct {
		t, end    int64 // when it may have been delivered: a pop's start and end
		op        *Op
		partition string
		offset    int64
		key, id   string
	}
	type failure struct {
		op        *Op
		t         int64
		partition string
		offset    int64
		id        string
	}
	judged := map[string]bool{}
	for q, qi := range c.st.Queues {
		if qi.HoldWait > 0 {
			judged[q] = true
		}
	}
	if len(judged) == 0 {
		return
	}
	pushed := map[qi2]int64{} // Queued push's completion
	byID := map[qgi][]del{}   // deliveries per group and message
	parts := map[qg]map[string][]string{}
	keyOf := map[qi2]string{}
	var fails []failure
	var spans []*Op // consume calls
	var faults []*Op
	var claims []*Op
	lost := map[qp][]int64{} // Consume settles refused as lease lost (settle-log), by partition
	at := map[qpo]string{}   // stored offset -> message id
	for _, o := range ops {
		if o.Inv.Op == OpFault && slices.Contains(holdFaults, o.Inv.Kind) {
			faults = append(faults, o)
			continue
		}
		if !judged[o.Inv.Queue] {
			continue
		}
		switch {
		case c.isCall(o, "settle-log") && o.Done != nil && strings.Contains(o.Done.Err, "lease lost"):
			k := qp{o.Inv.Queue, o.Inv.Partition}
			lost[k] = append(lost[k], o.Inv.T)
		case o.Inv.Op == OpPush && o.Phase() == OK:
			for i, r := range o.Done.Results {
				if r.Status == "queued" && r.ID != "" {
					pushed[qi2{o.Inv.Queue, r.ID}] = o.Done.T
					if i < len(o.Inv.Items) {
						at[qpo{o.Inv.Queue, o.Inv.Items[i].Partition, r.Offset}] = r.ID
					}
				}
			}
		case o.Inv.Op == OpClaim:
			claims = append(claims, o)
		case c.isCall(o, "consume") && o.Done != nil:
			spans = append(spans, o)
		case o.Inv.Op == OpSettle && o.Inv.Kind == "fail" && o.Phase() == OK:
			fails = append(fails, failure{o, o.Inv.T, o.Inv.Partition, o.Inv.Offset, o.Inv.ID})
		case o.Inv.Op == OpHandler && !o.Inv.AutoAck && o.Done != nil && o.Done.Err != "" && len(o.Inv.Msgs) == 1:
			m := o.Inv.Msgs[0]
			fails = append(fails, failure{o, o.Done.T, m.Partition, m.Offset, m.ID})
		}
		var t, end int64
		switch {
		case o.Inv.Op == OpPop && o.Phase() == OK:
			t, end = o.Inv.T, o.Done.T
		case o.Inv.Op == OpHandler:
			t, end = o.Inv.T, o.Inv.T
		default:
			continue
		}
		keys := o.Inv.Keys
		if o.Inv.Op == OpPop {
			keys = o.Done.Keys
		}
		for i, m := range delivered(o) {
			var key string
			if i < len(keys) {
				key = keys[i]
			}
			k := qgi{o.Inv.Queue, o.Inv.Group, m.ID}
			if byID[k] == nil {
				g := qg{o.Inv.Queue, o.Inv.Group}
				if parts[g] == nil {
					parts[g] = map[string][]string{}
				}
				parts[g][m.Partition] = append(parts[g][m.Partition], m.ID)
			}
			byID[k] = append(byID[k], del{t: t, end: end, op: o, partition: m.Partition, offset: m.Offset, key: key, id: m.ID})
			at[qpo{o.Inv.Queue, m.Partition, m.Offset}] = m.ID
			if i < len(keys) {
				keyOf[qi2{o.Inv.Queue, m.ID}] = key // not from a pop that recorded none (the final drain's)
			}
		}
	}
	// A Consume's claim took its messages (logged once it returned) even
	// where the batch's lease ended before their handlers could start.
	for _, o := range claims {
		for off := o.Inv.Offset; off <= o.Inv.Last && off-o.Inv.Offset < 1<<16; off++ {
			if id, ok := at[qpo{o.Inv.Queue, o.Inv.Partition, off}]; ok {
				k := qgi{o.Inv.Queue, o.Inv.Group, id}
				if byID[k] != nil {
					byID[k] = append(byID[k], del{t: o.Inv.T, end: o.Inv.T, op: o, partition: o.Inv.Partition, offset: off, id: id})
				}
			}
		}
	}
	// first is the earliest a delivery of k at or after from may have
	// been made.
	first := func(k qgi, from int64) (del, bool) {
		var best del
		found := false
		for _, d := range byID[k] {
			if d.end < from {
				continue
			}
			d.t = max(d.t, from)
			if !found || d.t < best.t {
				best, found = d, true
			}
		}
		return best, found
	}
	// running is the Batch of a Consume of g that ran from from to to (0:
	// none did, or its Batch is not known).
	running := func(g qg, from, to int64) int64 {
		var b int64
		for _, o := range spans {
			if o.Inv.Queue == g.queue && o.Inv.Group == g.group && o.Start() <= from && o.End() >= to {
				b = max(b, int64(o.Inv.Batch))
			}
		}
		return b
	}
	faulted := func(from, to int64) bool {
		return slices.ContainsFunc(faults, func(o *Op) bool { return o.Start() <= to && o.End() >= from-int64(holdAfter) })
	}
	bound := int64(holdBound)
	for _, f := range fails {
		g := qg{f.op.Inv.Queue, f.op.Inv.Group}
		qi := c.st.Queues[g.queue]
		wait := int64(qi.HoldWait)
		fkey := keyOf[qi2{g.queue, f.id}]
		for _, id := range parts[g][f.partition] {
			k := qgi{g.queue, g.group, id}
			key := keyOf[qi2{g.queue, id}]
			if id == f.id || !qi.Skip && key == fkey {
				continue
			}
			if slices.ContainsFunc(byID[k], func(d del) bool { return d.t < f.t }) {
				continue // delivered before the failure
			}
			tp, ok := pushed[qi2{g.queue, id}]
			if !ok {
				continue // not Queued: it may have waited in a spool
			}
			from := max(f.t, tp)
			// Any delivery after the failure, even one that returned
			// before the push did (a pop may read a message before its
			// pusher hears back).
			d, ok := first(k, f.t)
			if !ok {
				continue
			}
			// The failure holds nothing back once its message is delivered
			// again (its key resumed; under skip, its copy came round): a
			// later wait has another cause, judged as its own failure if
			// it is one.
			to := d.t
			if r, ok := first(qgi{g.queue, g.group, f.id}, f.t+1); ok {
				to = min(to, r.t)
			}
			if to-from < bound || faulted(from, d.t) {
				continue
			}
			// A Consume's settle of the partition refused as lease lost
			// meanwhile: the failure may not have been applied, and the
			// partition waited for that lease to expire.
			if slices.ContainsFunc(lost[qp{g.queue, f.partition}], func(t int64) bool { return t >= f.t && t <= d.t+bound }) {
				continue
			}
			// Other keys run at most one Batch ahead of a paused key, and a
			// claim after a skip-policy failure takes a Batch from it on.
			if b := running(g, from, from+bound); d.offset <= f.offset || d.offset-f.offset >= b {
				continue
			}
			if !qi.Skip && slices.ContainsFunc(fails, func(o failure) bool {
				return o.op.Inv.Queue == g.queue && o.op.Inv.Group == g.group && o.partition == f.partition &&
					keyOf[qi2{g.queue, o.id}] == key && o.t >= from-wait && o.t <= d.t
			}) {
				continue // its own key waits
			}
			kind, why := "key-stalled", fmt.Sprintf("key %q failed", fkey)
			if qi.Skip {
				kind, why = "skip-stalled", "failed under FailureSkip"
			}
			c.where = Violation{Queue: g.queue, Group: g.group, Partition: f.partition}
			c.report(kind, fmt.Sprintf("queue %s group %q: %s@%d (%s) at %s; %s@%d id %s (key %q), pushed by %s and not delivered before, was delivered only at %s, %s later, while a Consume of the group ran",
				g.queue, g.group, f.partition, f.offset, why, time.Unix(0, f.t).Format("15:04:05.000"), d.partition, d.offset, id, key,
				time.Unix(0, tp).Format("15:04:05.000"), time.Unix(0, d.t).Format("15:04:05.000"), time.Duration(d.t-from).Round(time.Millisecond)),
				append(f.op.evidence(), d.op.evidence()...)...)
			break
		}
	}
}

// qi2 is a message of a queue by id; qpo one by its place.
type qi2 struct{ queue, id string }
type qpo struct {
	queue, partition string
	offset           int64
}
