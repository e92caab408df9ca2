package queenui_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest"
	"github.com/e03140bc/queen/queenui"
)

// postTo sends a same-origin form to action with h's cookie.
func postTo(t *testing.T, h http.Handler, ck *http.Cookie, action string, form url.Values) resp {
	t.Helper()
	return do(t, h, "POST", "/"+action, form, func(r *http.Request) {
		r.AddCookie(ck)
		r.Header.Set("Origin", "http://example.com")
	})
}

// confirmedForm is the form a confirmation page submits.
func confirmedForm(t *testing.T, body string) url.Values {
	t.Helper()
	form := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(body, -1) {
		form.Add(m[1], m[2])
	}
	if form.Get("confirm") != "yes" {
		t.Fatalf("no confirmed form in the page:\n%s", body)
	}
	return form
}

func ids(dls []queen.DeadLetter) []int64 {
	var out []int64
	for _, d := range dls {
		out = append(out, d.ID)
	}
	return out
}

// TestActionsRefused: pause, resume and discard are refused without
// Options.Actions (403) and without a valid token, and change nothing.
func TestActionsRefused(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	deadLetters(t, q, "p", 2, "x", "bad")
	ctx := ctxT(t)
	ro := queenui.New(c, queenui.Options{})
	h := queenui.New(c, queenui.Options{Actions: true})
	ck, _ := session(t, h, queuePath("orders"))
	forms := map[string]url.Values{
		"pause":   {"queue": {"orders"}, "group": {""}, "confirm": {"yes"}},
		"resume":  {"queue": {"orders"}, "group": {"billing"}, "confirm": {"yes"}},
		"discard": {"queue": {"orders"}, "max": {"1000"}, "confirm": {"yes"}},
	}
	if err := q.Pause(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	for action, form := range forms {
		if res := do(t, ro, "POST", "/"+action, form, nil); res.code != http.StatusForbidden || !strings.Contains(res.body, "read-only") {
			t.Errorf("%s on a read-only dashboard: status %d, want 403", action, res.code)
		}
		for _, tok := range []string{"", "forged"} {
			f := url.Values{}
			for k, v := range form {
				f[k] = v
			}
			if tok != "" {
				f.Set("token", tok)
			}
			if res := postTo(t, h, ck, action, f); res.code != http.StatusForbidden {
				t.Errorf("%s with token %q: status %d, want 403", action, tok, res.code)
			}
		}
	}
	if dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{}); err != nil || len(dls) != 2 {
		t.Fatalf("dead letters after refused POSTs: %d, %v", len(dls), err)
	}
	qi := queueInfo(t, c, "orders")
	for _, g := range qi.Groups {
		if g.Paused != (g.Group == "billing") {
			t.Errorf("group %q paused %v after refused POSTs", g.Group, g.Paused)
		}
	}
}

func queueInfo(t *testing.T, c *queen.Client, name string) queen.QueueInfo {
	t.Helper()
	qs, err := c.Queues(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, qi := range qs {
		if qi.Name == name {
			return qi
		}
	}
	t.Fatalf("no queue %q", name)
	return queen.QueueInfo{}
}

func paused(t *testing.T, q *queen.Queue, group string) bool {
	t.Helper()
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range st.Partitions {
		for _, g := range p.Groups {
			if g.Group == group {
				n++
				if !g.Paused {
					return false
				}
			}
		}
	}
	if n == 0 {
		t.Fatalf("group %q not in the status", group)
	}
	return true
}

// TestPauseResume: each after its confirmation (which changes nothing),
// as Queue.Status then reports; the queue page shows the pause.
func TestPauseResume(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	ctx := ctxT(t)
	push(t, q, queen.Item{Partition: "p", Data: []byte("1")}, queen.Item{Partition: "p", Data: []byte("2")})
	if _, err := q.Pop(ctx, queen.PopOptions{Group: "billing", Partition: "p", Batch: 1, Wait: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	h := queenui.New(c, queenui.Options{Actions: true})
	ck, token := session(t, h, queuePath("orders"))
	res := postTo(t, h, ck, "pause", url.Values{"queue": {"orders"}, "group": {"billing"}, "token": {token}})
	if res.code != 200 || !strings.Contains(res.body, "Pause group billing?") {
		t.Fatalf("pause confirmation: status %d:\n%s", res.code, res.body)
	}
	if paused(t, q, "billing") {
		t.Fatal("the confirmation step paused the group")
	}
	res = postTo(t, h, ck, "pause", confirmedForm(t, res.body))
	if res.code != http.StatusSeeOther || res.header.Get("Location") != "queue?name=orders&paused=billing" {
		t.Fatalf("pause: status %d, location %q:\n%s", res.code, res.header.Get("Location"), res.body)
	}
	if !paused(t, q, "billing") {
		t.Fatal("not paused after the confirmed pause")
	}
	page := do(t, h, "GET", "/queue?name=orders&paused=billing", nil, nil).body
	if !strings.Contains(page, "Paused group billing.") || !regexp.MustCompile(`id="paused-banner">Paused: group <strong>billing</strong>`).MatchString(page) {
		t.Errorf("queue page after the pause lacks the notice or the banner:\n%s", page)
	}
	if !strings.Contains(page, `<button type="submit" class="resume">Resume…</button>`) {
		t.Errorf("no resume button for the paused group:\n%s", page)
	}
	res = postTo(t, h, ck, "resume", url.Values{"queue": {"orders"}, "group": {"billing"}, "token": {token}})
	if res.code != 200 || !strings.Contains(res.body, "Resume group billing?") || !paused(t, q, "billing") {
		t.Fatalf("resume confirmation: status %d:\n%s", res.code, res.body)
	}
	res = postTo(t, h, ck, "resume", confirmedForm(t, res.body))
	if res.code != http.StatusSeeOther || res.header.Get("Location") != "queue?name=orders&resumed=billing" {
		t.Fatalf("resume: status %d, location %q:\n%s", res.code, res.header.Get("Location"), res.body)
	}
	if paused(t, q, "billing") {
		t.Fatal("still paused after the confirmed resume")
	}
	if page := do(t, h, "GET", queuePath("orders"), nil, nil).body; strings.Contains(page, "paused-banner") {
		t.Errorf("banner after the resume:\n%s", page)
	}
	if res := postTo(t, h, ck, "pause", url.Values{"queue": {""}, "token": {token}}); res.code != http.StatusBadRequest {
		t.Errorf("pause without a queue: status %d, want 400", res.code)
	}
}

// TestPausedBeforeFirstPop: a group paused before any pop has no cursor:
// the front page says paused (not "lag 0"), the queue page names it in
// the banner and its row.
func TestPausedBeforeFirstPop(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	push(t, q, queen.Item{Partition: "p", Data: []byte("1")}, queen.Item{Partition: "p", Data: []byte("2")})
	if err := q.Pause(ctxT(t), "billing"); err != nil {
		t.Fatal(err)
	}
	h := queenui.New(c, queenui.Options{})
	front := do(t, h, "GET", "/", nil, nil).body
	if !strings.Contains(front, `<span class="badge paused">paused</span>`) || !strings.Contains(front, "billing: paused</span>") ||
		strings.Contains(front, "billing: 0") {
		t.Errorf("front page does not show billing paused:\n%s", front)
	}
	page := do(t, h, "GET", queuePath("orders"), nil, nil).body
	if !strings.Contains(page, `id="paused-banner">Paused: group <strong>billing</strong>`) ||
		!regexp.MustCompile(`(?s)<tr id="group-billing">.*?<span class="paused">paused</span> <span class="meta">\(no pop yet`).MatchString(page) {
		t.Errorf("queue page does not show billing paused:\n%s", page)
	}
}

// TestDeadLetterCounts: the front page and the queue page count a
// queue's dead letters (depth does not include them).
func TestDeadLetterCounts(t *testing.T) {
	c := queentest.Open(t)
	deadLetters(t, c.Queue("orders"), "p", 3, "x", "bad")
	h := queenui.New(c, queenui.Options{DeadLetters: 1})
	front := do(t, h, "GET", "/", nil, nil).body
	if !regexp.MustCompile(`<td class="num dead"><a class="warn" href="queue\?name=orders#dead-letters-h">3</a></td>`).MatchString(front) {
		t.Errorf("front page lacks the dead-letter count 3:\n%s", front)
	}
	page := do(t, h, "GET", queuePath("orders"), nil, nil).body
	if !strings.Contains(page, `<span class="count" id="dead-count">(3)</span>`) {
		t.Errorf("queue page lacks the dead-letter count 3:\n%s", page)
	}
}

// TestDiscardOne: by id, after a confirmation showing it; exactly that
// one goes; a second submission finds it gone.
func TestDiscardOne(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	deadLetters(t, q, "p", 3, "payload", "bad")
	ctx := ctxT(t)
	dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(dls) != 3 {
		t.Fatalf("dead letters: %d, %v", len(dls), err)
	}
	h := queenui.New(c, queenui.Options{Actions: true})
	ck, token := session(t, h, queuePath("orders"))
	id := strconv.FormatInt(dls[1].ID, 10)
	res := postTo(t, h, ck, "discard", url.Values{"queue": {"orders"}, "id": {id}, "token": {token}})
	if res.code != 200 || !strings.Contains(res.body, "Dead letter "+id+" of queue") || !strings.Contains(res.body, "deleted for good") {
		t.Fatalf("confirmation: status %d:\n%s", res.code, res.body)
	}
	if left, _ := q.DeadLetters(ctx, queen.DeadLetterQuery{}); len(left) != 3 {
		t.Fatal("the confirmation step discarded something")
	}
	form := confirmedForm(t, res.body)
	res = postTo(t, h, ck, "discard", form)
	if res.code != http.StatusSeeOther || res.header.Get("Location") != "queue?name=orders&discarded=1" {
		t.Fatalf("discard: status %d, location %q:\n%s", res.code, res.header.Get("Location"), res.body)
	}
	left, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(left) != 2 || left[0].ID != dls[0].ID || left[1].ID != dls[2].ID {
		t.Fatalf("dead letters after discarding %s: %v, %v", id, ids(left), err)
	}
	if st, _ := q.Status(ctx); st.Partitions[0].LastOffset != 2 {
		t.Errorf("discard pushed something: last offset %d", st.Partitions[0].LastOffset)
	}
	if res := postTo(t, h, ck, "discard", form); res.code != http.StatusNotFound {
		t.Fatalf("second discard: status %d:\n%s", res.code, res.body)
	}
	if page := do(t, h, "GET", "/queue?name=orders&discarded=1", nil, nil).body; !strings.Contains(page, "Discarded 1 dead letter.") {
		t.Errorf("no notice after the discard")
	}
}

// TestDiscardFiltered: the confirmation counts what the filters select;
// the discard deletes exactly those, and none dead-lettered after the
// confirmation (they match the filters too).
func TestDiscardFiltered(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	deadLetters(t, q, "a", 3, "a", "bad")
	deadLetters(t, q, "b", 2, "b", "bad")
	ctx := ctxT(t)
	h := queenui.New(c, queenui.Options{Actions: true})
	ck, token := session(t, h, queuePath("orders"))
	// Every group ("*"), partition a.
	res := postTo(t, h, ck, "discard", url.Values{"queue": {"orders"}, "g": {"*"}, "partition": {"a"}, "token": {token}})
	if res.code != 200 || !strings.Contains(res.body, `<span id="confirm-count">3</span> dead letters of queue`) {
		t.Fatalf("confirmation: status %d:\n%s", res.code, res.body)
	}
	form := confirmedForm(t, res.body)
	deadLetters(t, q, "a", 1, "late", "bad") // after the confirmation
	res = postTo(t, h, ck, "discard", form)
	if res.code != http.StatusSeeOther || res.header.Get("Location") != "queue?name=orders&discarded=3" {
		t.Fatalf("discard: status %d, location %q:\n%s", res.code, res.header.Get("Location"), res.body)
	}
	left, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(left) != 3 {
		t.Fatalf("left %d, %v; want b's 2 and the late one", len(left), err)
	}
	for _, d := range left {
		if d.Partition == "a" && string(d.Data) != "late" {
			t.Errorf("dead letter %d of a, %q, left", d.ID, d.Data)
		}
	}
	// Queue mode's ("=" + "") of every partition: all 3 now, nothing from
	// another group.
	res = postTo(t, h, ck, "discard", url.Values{"queue": {"orders"}, "g": {"="}, "token": {token}})
	if res.code != 200 || !strings.Contains(res.body, `<span id="confirm-count">3</span>`) || !strings.Contains(res.body, "group (queue mode)") {
		t.Fatalf("confirmation for queue mode: status %d:\n%s", res.code, res.body)
	}
	form = confirmedForm(t, res.body)
	if _, ok := form["group"]; !ok {
		t.Fatalf("the confirmed form drops the group filter: %v", form)
	}
	res = postTo(t, h, ck, "discard", form)
	if res.code != http.StatusSeeOther || res.header.Get("Location") != "queue?name=orders&discarded=3" {
		t.Fatalf("discard: status %d, location %q", res.code, res.header.Get("Location"))
	}
	// With nothing left the confirmation says 0 and the discard does nothing.
	res = postTo(t, h, ck, "discard", url.Values{"queue": {"orders"}, "token": {token}})
	if !strings.Contains(res.body, `<span id="confirm-count">0</span>`) {
		t.Fatalf("confirmation with none:\n%s", res.body)
	}
	deadLetters(t, q, "a", 1, "later", "bad")
	res = postTo(t, h, ck, "discard", confirmedForm(t, res.body))
	if res.header.Get("Location") != "queue?name=orders&discarded=0" {
		t.Fatalf("discard of none: location %q", res.header.Get("Location"))
	}
	if left, _ := q.DeadLetters(ctx, queen.DeadLetterQuery{}); len(left) != 1 {
		t.Fatalf("%d left, want the one dead-lettered after the confirmation", len(left))
	}
	if res := postTo(t, h, ck, "discard", url.Values{"queue": {"orders"}, "since": {"yesterday"}, "token": {token}}); res.code != http.StatusBadRequest {
		t.Errorf("bad since: status %d, want 400", res.code)
	}
}
