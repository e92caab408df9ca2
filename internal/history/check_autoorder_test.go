package history

import (
	"fmt"
	"testing"
)

// One AutoAck Consume call hands a partition's messages in offset order
// across its batches: a later batch's handlers started before an earlier
// one's is autoack-order. Other partitions interleave freely; a call with
// KeyConcurrency above 1 (Keyed) keeps order only per key; two calls of one
// proc, queue and group at once cannot be told apart.
func TestCheckAutoAckOrder(t *testing.T) {
	d := func(p string, o int64) Delivery {
		return Delivery{p, o, fmt.Sprintf("id-%s%d", p, o), fmt.Sprintf("t-%s%d", p, o), "", 1, 0}
	}
	type run struct {
		p    string
		offs []int64
	}
	build := func(keyed, twoCalls bool, runs ...run) (*hb, State) {
		h := newHB()
		var items []Item
		var res []Result
		var log []Stored
		for _, p := range []string{"p", "r"} {
			for o := range int64(4) {
				m := d(p, o)
				items = append(items, Item{p, m.TxID})
				res = append(res, Result{"queued", m.ID, o})
				log = append(log, Stored{"q", p, o, m.ID, m.TxID, 0, false})
			}
		}
		h.push("a", "q", items, OK, res...)
		call := h.r.Invoke(Event{Proc: "w", Op: OpCall, Kind: "consume", Queue: "q", Group: "g", AutoAck: true, Keyed: keyed, T: h.tick()})
		var other Event
		if twoCalls {
			other = h.r.Invoke(Event{Proc: "w", Op: OpCall, Kind: "consume", Queue: "q", Group: "g", AutoAck: true, T: h.tick()})
		}
		for i := 0; ; i++ { // the runs' handlers interleaved, one of each in turn
			more := false
			for _, r := range runs {
				if i >= len(r.offs) {
					continue
				}
				more = true
				m := d(r.p, r.offs[i])
				inv := h.r.Invoke(Event{Proc: "w", Op: OpHandler, Queue: "q", Group: "g", Partition: r.p, Offset: m.Offset, Msgs: []Delivery{m}, AutoAck: true, T: h.tick()})
				h.r.Done(inv, OK, Event{T: h.tick()})
			}
			if !more {
				break
			}
		}
		if twoCalls {
			h.r.Done(other, OK, Event{T: h.tick()})
		}
		h.r.Done(call, OK, Event{T: h.tick()})
		s := stMore(log...)
		return h, s
	}
	for _, tc := range []struct {
		name            string
		keyed, twoCalls bool
		runs            []run
		want            int
	}{
		{"in order, partitions interleaved", false, false, []run{{"p", []int64{0, 1, 2, 3}}, {"r", []int64{0, 1, 2, 3}}}, 0},
		{"a later batch handed first", false, false, []run{{"p", []int64{2, 3, 0, 1}}, {"r", []int64{0, 1, 2, 3}}}, 1},
		{"keyed: order per key only", true, false, []run{{"p", []int64{2, 3, 0, 1}}, {"r", []int64{0, 1, 2, 3}}}, 0},
		{"two calls at once", false, true, []run{{"p", []int64{2, 3}}, {"p", []int64{0, 1}}, {"r", []int64{0, 1, 2, 3}}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, s := build(tc.keyed, tc.twoCalls, tc.runs...)
			vs := Check(h.r.Events(), s, 0)
			if got := Counts(vs); got["autoack-order"] != tc.want || len(vs) != tc.want {
				t.Errorf("got %v, want %d autoack-order and nothing else", vs, tc.want)
			}
		})
	}
}
