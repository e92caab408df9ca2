package history

import (
	"testing"
	"time"
)

// misuseCall records a call with the given invoke fields, completed after
// took with phase and err.
func (h *hb) misuseCall(inv Event, took time.Duration, phase, err string) {
	inv.Proc, inv.T = "a", h.tick()
	if inv.Op == "" {
		inv.Op = OpCall
	}
	if inv.Deadline != 0 {
		inv.Deadline += inv.T
	}
	e := h.r.Invoke(inv)
	h.t += int64(took)
	h.r.Done(e, phase, Event{Err: err, T: h.tick()})
}

// Each misuse call broken one way; the checker must name that and nothing
// else.
func TestCheckFindsEachMisuse(t *testing.T) {
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	cases := []struct {
		name string
		call func(h *hb)
	}{
		{"panic", func(h *hb) {
			h.misuseCall(Event{Kind: "ack-nil", Invalid: true}, 0, Info, "panic: runtime error: invalid memory address or nil pointer dereference")
		}},
		{"secret-leak", func(h *hb) {
			h.misuseCall(Event{Kind: "open-url", Invalid: true, Secret: "Xk7qQz@w9Rt2m"}, 0, Fail,
				"queen: parse DatabaseURL: cannot parse `postgres://alice:xxxxx@w9Rt2m@localhost:badport/db`: invalid port")
		}},
		{"close-late", func(h *hb) {
			h.misuseCall(Event{Kind: "close", Deadline: int64(time.Second)}, 20*time.Second, OK, "")
		}},
		{"open-late", func(h *hb) {
			h.misuseCall(Event{Kind: "open", Deadline: int64(time.Second)}, 20*time.Second, Fail, "queen: ping: context deadline exceeded")
		}},
		{"data-exception", func(h *hb) {
			h.misuseCall(Event{Op: OpPush, Kind: "pushtx", Queue: "q", Items: []Item{{"p", "t9"}}}, 0, Fail,
				"queen: notify: ERROR: channel name too long (SQLSTATE 22023)")
		}},
		{"data-exception", func(h *hb) {
			inv := h.r.Invoke(Event{Proc: "a", Op: OpPush, Queue: "q", Items: []Item{{"p", "t9"}}, T: h.tick()})
			h.r.Done(inv, OK, Event{Results: []Result{{Status: "failed", Offset: -1}}, T: h.tick(),
				ItemErr: "queen: push: ERROR: invalid byte sequence for encoding \"UTF8\": 0x00 (SQLSTATE 22021)"})
		}},
		{"invalid-accepted", func(h *hb) {
			h.misuseCall(Event{Kind: "configure-lease-500µs", Queue: "misuse-lease", Invalid: true}, 0, OK, "")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
			h.pop("a", "q", "g", false, d0)
			h.settle("a", "q", "g", "ack", d0, OK)
			tc.call(h)
			got := Counts(Check(h.r.Events(), st(Stored{"q", "p", 0, "id1", "t1", 0, false}), 0))
			if got[tc.name] == 0 || len(got) != 1 {
				t.Errorf("want only %s, got %v", tc.name, got)
			}
		})
	}
}

// The same calls as the library keeps their contracts: nil messages get
// an error, a bad URL's error names its problem without the password,
// Close and Open return by their deadlines (a scheduler's delay allowed),
// and invalid input and data exceptions of invalid calls fail as they must.
func TestCheckMisuseClean(t *testing.T) {
	h := newHB()
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	h.pop("a", "q", "g", false, d0)
	h.settle("a", "q", "g", "ack", d0, OK)
	h.misuseCall(Event{Kind: "ack-nil", Invalid: true}, 0, Fail, "queen: unknown message")
	h.misuseCall(Event{Kind: "open-url", Invalid: true, Secret: "Xk7qQz@w9Rt2m"}, 0, Fail,
		"queen: parse DatabaseURL: invalid port (an '@' where the host or database name should be: percent-encode '@' (%40), '/' (%2F) and ':' (%3A) in the user name and password)")
	h.misuseCall(Event{Kind: "close", Deadline: int64(time.Second)}, 8*time.Second, Info, "context deadline exceeded")
	h.misuseCall(Event{Kind: "open", Deadline: int64(time.Second)}, 2*time.Second, Fail, "queen: ping: failed to connect: timeout")
	h.misuseCall(Event{Kind: "configure-lease-500µs", Queue: "misuse-lease", Invalid: true}, 0, Fail, "queen: QueueOptions.LeaseTime 500µs is under the 1ms minimum")
	// A push during an outage, and an invalid one the server refused.
	h.misuseCall(Event{Op: OpPush, Kind: "pushtx", Queue: "q", Items: []Item{{"p", "t8"}}}, 0, Fail, "queen: push: FATAL: terminating connection due to administrator command (SQLSTATE 57P01)")
	h.misuseCall(Event{Op: OpPush, Kind: "pushtx", Queue: "q", Items: []Item{{"p", "t9"}}, Invalid: true}, 0, Fail, "ERROR: invalid byte sequence for encoding \"UTF8\": 0x00 (SQLSTATE 22021)")
	// A child process killed during an invalid push: the call has no
	// completion, which says nothing about how it would have ended.
	h.r.Invoke(Event{Proc: "child-1", Op: OpPush, Kind: "tx", Queue: "q", Items: []Item{{"s0", "t10"}}, Invalid: true, T: h.tick()})
	h.r.Invoke(Event{Proc: "child-1", Op: OpCall, Kind: "close", Deadline: h.t + int64(time.Second), T: h.tick()})
	for _, v := range Check(h.r.Events(), st(Stored{"q", "p", 0, "id1", "t1", 0, false}), 0) {
		t.Error(v)
	}
}
