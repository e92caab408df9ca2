package queenui_test

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest"
	"github.com/e03140bc/queen/queenui"
)

// TestGroupOps: reset (earliest, latest), release a lease and delete a
// group, each after a confirmation page that changes nothing; an active
// group's reset is refused with the reason and a forced form; the
// read-only dashboard refuses them all.
func TestGroupOps(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	ctx := ctxT(t)
	push(t, q, queen.Item{Partition: "p", Data: []byte("a")}, queen.Item{Partition: "p", Data: []byte("b")})
	if ms, err := q.Pop(ctx, queen.PopOptions{Group: "billing", Partition: "p", Batch: 10, AutoAck: true}); err != nil || len(ms) != 2 {
		t.Fatalf("billing's first pop: %d, %v", len(ms), err)
	}
	ro := queenui.New(c, queenui.Options{})
	h := queenui.New(c, queenui.Options{Actions: true})
	ck, tok := session(t, h, queuePath("orders"))
	form := func(kv ...string) url.Values {
		f := url.Values{"token": {tok}, "queue": {"orders"}}
		for i := 0; i+1 < len(kv); i += 2 {
			f.Set(kv[i], kv[i+1])
		}
		return f
	}
	for _, a := range []string{"reset", "delete-group", "release"} {
		if res := do(t, ro, "POST", "/"+a, form("group", "billing", "to", "earliest", "partition", "p", "confirm", "yes"), nil); res.code != http.StatusForbidden {
			t.Errorf("%s on a read-only dashboard: status %d, want 403", a, res.code)
		}
	}

	// Reset to earliest: the confirmation changes nothing, then billing
	// reads both messages again.
	res := postTo(t, h, ck, "reset", form("group", "billing", "to", "earliest"))
	if res.code != http.StatusOK || !strings.Contains(res.body, "Reset group billing to the earliest offsets?") {
		t.Fatalf("reset confirmation: %d\n%s", res.code, res.body)
	}
	if ms, _ := q.Pop(ctx, queen.PopOptions{Group: "billing", Partition: "p", AutoAck: true}); len(ms) != 0 {
		t.Fatalf("the confirmation page reset the group: popped %d", len(ms))
	}
	if res = postTo(t, h, ck, "reset", confirmedForm(t, res.body)); res.code != http.StatusSeeOther {
		t.Fatalf("confirmed reset: status %d\n%s", res.code, res.body)
	}
	if page := do(t, h, "GET", "/"+res.header.Get("Location"), nil, nil); !strings.Contains(page.body, "Reset group billing to the earliest offsets of 1 partitions.") {
		t.Errorf("no notice after the reset:\n%s", page.body)
	}

	// A live lease makes billing active: refused with the reason and a
	// forced form; forced, the holder's ack is refused.
	held, err := q.Pop(ctx, queen.PopOptions{Group: "billing", Partition: "p", Batch: 10})
	if err != nil || len(held) != 2 || held[0].Offset != 0 {
		t.Fatalf("billing after the reset: %d messages, %v; want both again from offset 0", len(held), err)
	}
	res = postTo(t, h, ck, "reset", form("group", "billing", "to", "latest", "confirm", "yes"))
	if res.code != http.StatusConflict || !strings.Contains(res.body, `id="confirm-force"`) || !strings.Contains(res.body, "Force reset") {
		t.Fatalf("reset of an active group: status %d, want 409 with a forced form\n%s", res.code, res.body)
	}
	if err := held[0].Ack(ctx); err != nil {
		t.Fatalf("the refused reset touched the lease: %v", err)
	}
	if res = postTo(t, h, ck, "reset", confirmedForm(t, res.body)); res.code != http.StatusSeeOther {
		t.Fatalf("forced reset: status %d\n%s", res.code, res.body)
	}
	// Refused: the reset to latest moved the cursor past it.
	if err := held[1].Ack(ctx); !errors.Is(err, queen.ErrAlreadyAcked) && !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("ack after a forced reset: %v, want it refused", err)
	}
	if ms, _ := q.Pop(ctx, queen.PopOptions{Group: "billing", Partition: "p", AutoAck: true}); len(ms) != 0 {
		t.Fatalf("after a reset to latest billing popped %d, want nothing", len(ms))
	}

	// Release audit's lease: its messages come back on the first attempt,
	// and the old holder's ack is refused.
	lease, err := q.Pop(ctx, queen.PopOptions{Group: "audit", Partition: "p", Batch: 10})
	if err != nil || len(lease) != 2 {
		t.Fatalf("audit's pop: %d, %v", len(lease), err)
	}
	page := do(t, h, "GET", queuePath("orders"), nil, nil)
	if !strings.Contains(page.body, `class="release"`) {
		t.Errorf("the queue page offers no release for audit's lease:\n%s", page.body)
	}
	res = postTo(t, h, ck, "release", form("group", "audit", "partition", "p"))
	if res.code != http.StatusOK || !strings.Contains(res.body, "Release group audit") {
		t.Fatalf("release confirmation: %d\n%s", res.code, res.body)
	}
	if res = postTo(t, h, ck, "release", confirmedForm(t, res.body)); res.code != http.StatusSeeOther {
		t.Fatalf("confirmed release: status %d\n%s", res.code, res.body)
	}
	if err := lease[0].Ack(ctx); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("ack after a release: %v, want ErrLeaseLost", err)
	}
	again, err := q.Pop(ctx, queen.PopOptions{Group: "audit", Partition: "p", Batch: 10, AutoAck: true})
	if err != nil || len(again) != 2 || again[0].Offset != 0 || again[0].Attempt != 1 {
		t.Fatalf("audit after the release: %+v, %v; want offsets 0 and 1 again, attempt 1", again, err)
	}

	// Delete billing: gone from the status, audit untouched.
	res = postTo(t, h, ck, "delete-group", form("group", "billing"))
	if res.code != http.StatusOK || !strings.Contains(res.body, "Delete group billing?") {
		t.Fatalf("delete confirmation: %d\n%s", res.code, res.body)
	}
	if res = postTo(t, h, ck, "delete-group", confirmedForm(t, res.body)); res.code != http.StatusSeeOther {
		t.Fatalf("confirmed delete: status %d\n%s", res.code, res.body)
	}
	st, err := q.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		for _, g := range p.Groups {
			if g.Group == "billing" {
				t.Errorf("billing still in the status after its delete: %+v", g)
			}
		}
	}
	if res = postTo(t, h, ck, "delete-group", form("group", "billing", "confirm", "yes")); res.code != http.StatusNotFound {
		t.Errorf("deleting billing twice: status %d, want 404", res.code)
	}
}
