package queenui_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest"
	"github.com/e03140bc/queen/queenui"
)

func TestMain(m *testing.M) { queentest.Main(m) }

// Hostile names and payloads: each would run a script or break the markup
// if shown unescaped.
const (
	evilQueue     = `<script>alert("queue")</script>`
	evilPartition = `<img src=x onerror=alert(2)>`
	evilPayload   = `<script>window.pwned=1</script>`
	evilReason    = `<b onmouseover=alert(3)>bold</b>`
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func push(t *testing.T, q *queen.Queue, items ...queen.Item) {
	t.Helper()
	res, err := q.Push(ctxT(t), items)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != queen.Queued {
			t.Fatalf("push %d: %s %v", i, r.Status, r.Err)
		}
	}
}

// deadLetters pushes n messages to partition and dead-letters them.
func deadLetters(t *testing.T, q *queen.Queue, partition string, n int, payload, reason string) {
	t.Helper()
	ctx := ctxT(t)
	if err := q.Configure(ctx, queen.QueueOptions{DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	items := make([]queen.Item, n)
	for i := range items {
		items[i] = queen.Item{Partition: partition, Data: []byte(payload)}
	}
	push(t, q, items...)
	for left := n; left > 0; {
		msgs, err := q.Pop(ctx, queen.PopOptions{Partition: partition, Batch: left, Wait: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := m.DeadLetter(ctx, errors.New(reason)); err != nil {
				t.Fatal(err)
			}
		}
		left -= len(msgs)
	}
}

type resp struct {
	code   int
	body   string
	header http.Header
}

func do(t *testing.T, h http.Handler, method, target string, form url.Values, mod func(*http.Request)) resp {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	r := httptest.NewRequest(method, target, body)
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if mod != nil {
		mod(r)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return resp{w.Code, w.Body.String(), w.Header()}
}

func queuePath(name string) string { return "/queue?name=" + url.QueryEscape(name) }

// TestQueuePageEscapes: hostile queue, partition, payload and reason are
// shown, escaped, and never as markup.
func TestQueuePageEscapes(t *testing.T) {
	c := queentest.Open(t)
	deadLetters(t, c.Queue(evilQueue), evilPartition, 2, evilPayload, evilReason)
	push(t, c.Queue(evilQueue), queen.Item{Partition: evilPartition, Data: []byte("live")})
	h := queenui.New(c, queenui.Options{Actions: true})

	res := do(t, h, "GET", queuePath(evilQueue), nil, nil)
	if res.code != 200 {
		t.Fatalf("status %d: %s", res.code, res.body)
	}
	for _, raw := range []string{evilQueue, evilPartition, evilPayload, evilReason, "<script>alert", "<img", "<b "} {
		if strings.Contains(res.body, raw) {
			t.Errorf("page holds %q unescaped", raw)
		}
	}
	for _, esc := range []string{
		`&lt;script&gt;alert(&#34;queue&#34;)&lt;/script&gt;`,
		`&lt;img src=x onerror=alert(2)&gt;`,
		`&lt;script&gt;window.pwned=1&lt;/script&gt;`,
		`&lt;b onmouseover=alert(3)&gt;bold&lt;/b&gt;`,
	} {
		if !strings.Contains(res.body, esc) {
			t.Errorf("page lacks escaped %q", esc)
		}
	}
	// Two dead letters with a replay button each, and the partition's log.
	if n := strings.Count(res.body, `class="replay"`); n != 2 {
		t.Errorf("%d replay buttons, want 2", n)
	}
	if !regexp.MustCompile(`<td class="num"[^>]*>2</td>`).MatchString(res.body) {
		t.Errorf("page does not show last offset 2")
	}
	if csp := res.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy %q does not restrict scripts", csp)
	}
	// The hidden form fields carry the name escaped too (attribute context).
	if !strings.Contains(res.body, `name="queue" value="&lt;script&gt;`) {
		t.Errorf("form field does not carry the escaped queue name")
	}
}

func TestQueuePageUnknownQueue(t *testing.T) {
	c := queentest.Open(t)
	h := queenui.New(c, queenui.Options{})
	res := do(t, h, "GET", queuePath(evilQueue), nil, nil)
	if res.code != http.StatusNotFound {
		t.Fatalf("status %d, want 404", res.code)
	}
	if !strings.Contains(res.body, `There is no queue &#34;&lt;script&gt;alert(\&#34;queue\&#34;)&lt;/script&gt;&#34;`) {
		t.Errorf("404 page does not name the queue escaped:\n%s", res.body)
	}
	if res := do(t, h, "GET", "/queue", nil, nil); res.code != http.StatusBadRequest {
		t.Errorf("no name: status %d, want 400", res.code)
	}
	if res := do(t, h, "GET", "/nowhere", nil, nil); res.code != http.StatusNotFound {
		t.Errorf("unknown page: status %d, want 404", res.code)
	}
}

// TestReadOnly: no action is offered and every POST is refused, even with
// a valid-looking form.
func TestReadOnly(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	deadLetters(t, q, "p", 1, "x", "bad")
	h := queenui.New(c, queenui.Options{})
	res := do(t, h, "GET", queuePath("orders"), nil, nil)
	if res.code != 200 || strings.Contains(res.body, "<form") || !strings.Contains(res.body, "read-only") {
		t.Fatalf("read-only page: status %d, has a form or lacks the read-only mark:\n%s", res.code, res.body)
	}
	if res.header.Get("Set-Cookie") != "" {
		t.Errorf("read-only page sets a cookie: %q", res.header.Get("Set-Cookie"))
	}
	res = do(t, h, "POST", "/replay", url.Values{"queue": {"orders"}, "confirm": {"yes"}, "token": {"x"}}, nil)
	if res.code != http.StatusForbidden || !strings.Contains(res.body, "read-only") {
		t.Fatalf("POST to a read-only dashboard: status %d:\n%s", res.code, res.body)
	}
	dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters after refused POST: %d, %v", len(dls), err)
	}
}

// session GETs a page of h and returns its CSRF cookie and form token.
func session(t *testing.T, h http.Handler, target string) (*http.Cookie, string) {
	t.Helper()
	r := httptest.NewRequest("GET", target, nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	cookies := w.Result().Cookies()
	if len(cookies) != 1 {
		t.Fatalf("%d cookies, want 1", len(cookies))
	}
	ck := cookies[0]
	if ck.SameSite != http.SameSiteStrictMode || !ck.HttpOnly {
		t.Errorf("cookie %v: want SameSite=Strict and HttpOnly", ck)
	}
	m := regexp.MustCompile(`name="token" value="([^"]+)"`).FindStringSubmatch(w.Body.String())
	if m == nil {
		t.Fatalf("no token in the page:\n%s", w.Body.String())
	}
	return ck, m[1]
}

// TestCSRF: a POST goes through only with this handler's token for the
// cookie it is sent with, from the same origin.
func TestCSRF(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	deadLetters(t, q, "p", 1, "x", "bad")
	h := queenui.New(c, queenui.Options{Actions: true})
	other := queenui.New(c, queenui.Options{Actions: true})
	ck, token := session(t, h, queuePath("orders"))
	_, otherToken := session(t, other, queuePath("orders"))
	_, otherToken2 := session(t, h, queuePath("orders")) // a token for another cookie
	form := func(tok string) url.Values {
		return url.Values{"queue": {"orders"}, "confirm": {"yes"}, "token": {tok}}
	}
	withCookie := func(r *http.Request) { r.AddCookie(ck) }
	for _, tc := range []struct {
		name string
		form url.Values
		mod  func(*http.Request)
	}{
		{"no token", url.Values{"queue": {"orders"}, "confirm": {"yes"}}, withCookie},
		{"no cookie", form(token), nil},
		{"another handler's token", form(otherToken), withCookie},
		{"another cookie's token", form(otherToken2), withCookie},
		{"cross-site fetch", form(token), func(r *http.Request) { withCookie(r); r.Header.Set("Sec-Fetch-Site", "cross-site") }},
		{"foreign origin", form(token), func(r *http.Request) { withCookie(r); r.Header.Set("Origin", "https://evil.example") }},
	} {
		res := do(t, h, "POST", "/replay", tc.form, tc.mod)
		if res.code != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", tc.name, res.code)
		}
	}
	dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters after refused POSTs: %d, %v", len(dls), err)
	}
	// The genuine form asks for confirmation first and changes nothing.
	res := do(t, h, "POST", "/replay", url.Values{"queue": {"orders"}, "token": {token}}, func(r *http.Request) {
		withCookie(r)
		r.Header.Set("Origin", "http://example.com")
		r.Header.Set("Sec-Fetch-Site", "same-origin")
	})
	if res.code != 200 || !strings.Contains(res.body, `name="confirm" value="yes"`) || !strings.Contains(res.body, "1 dead letter of queue") {
		t.Fatalf("unconfirmed replay: status %d:\n%s", res.code, res.body)
	}
	if dls, _ := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{}); len(dls) != 1 {
		t.Fatalf("the confirmation step replayed something")
	}
}

// TestPartialAndStatic: the refresh fetches only the live part; the assets
// are served from the embedded files.
func TestPartialAndStatic(t *testing.T) {
	c := queentest.Open(t)
	push(t, c.Queue("orders"), queen.Item{Partition: "p1", Data: []byte("x")})
	h := queenui.New(c, queenui.Options{})
	res := do(t, h, "GET", queuePath("orders"), nil, func(r *http.Request) { r.Header.Set("X-Queen-Partial", "1") })
	if res.code != 200 || strings.Contains(res.body, "<html") || !strings.Contains(res.body, `<table id="partitions">`) {
		t.Fatalf("partial: status %d:\n%s", res.code, res.body)
	}
	full := do(t, h, "GET", queuePath("orders"), nil, nil)
	if !strings.Contains(full.body, `<div id="live">`) || !strings.Contains(full.body, `data-refresh="5000"`) {
		t.Errorf("full page lacks the live part or the refresh interval:\n%s", full.body)
	}
	for path, ctype := range map[string]string{"/static/app.js": "javascript", "/static/app.css": "text/css"} {
		res := do(t, h, "GET", path, nil, nil)
		if res.code != 200 || !strings.Contains(res.header.Get("Content-Type"), ctype) {
			t.Errorf("%s: status %d, type %q", path, res.code, res.header.Get("Content-Type"))
		}
	}
	// Mounted under a prefix: the page's relative links reach the assets.
	mounted := http.StripPrefix("/queen", h)
	if res := do(t, mounted, "GET", "/queen/", nil, nil); res.code != 200 || !strings.Contains(res.body, `src="static/app.js"`) {
		t.Errorf("mounted page: status %d", res.code)
	}
	if res := do(t, mounted, "GET", "/queen/static/app.js", nil, nil); res.code != 200 {
		t.Errorf("mounted asset: status %d", res.code)
	}
	if res := do(t, h, "PUT", "/", nil, nil); res.code != http.StatusMethodNotAllowed {
		t.Errorf("PUT: status %d, want 405", res.code)
	}
}

func TestPreview(t *testing.T) {
	for _, tc := range []struct {
		in     []byte
		max    int
		want   string
		binary bool
	}{
		{[]byte("hello"), 10, "hello", false},
		{[]byte("héllo"), 2, "h…", false}, // never cuts inside a character
		{[]byte{0xff, 0x00, 0x01}, 10, "ff0001", true},
		{[]byte{0xff, 0x00, 0x01, 0x02}, 4, "ff00…", true},
		{nil, 10, "", false},
	} {
		got, bin := queenui.Preview(tc.in, tc.max)
		if got != tc.want || bin != tc.binary {
			t.Errorf("Preview(%q, %d) = %q, %v; want %q, %v", tc.in, tc.max, got, bin, tc.want, tc.binary)
		}
	}
}

// TestOverview: queues with partitions, depth and groups (a paused one
// marked), names escaped, and the maintenance flag.
func TestOverview(t *testing.T) {
	c := queentest.Open(t)
	ctx := ctxT(t)
	push(t, c.Queue(evilQueue), queen.Item{Partition: "a", Data: []byte("1")}, queen.Item{Partition: "b", Data: []byte("2")},
		queen.Item{Partition: "b", Data: []byte("3")})
	push(t, c.Queue("orders"), queen.Item{Partition: "p", Data: []byte("x")})
	if err := c.Queue("orders").Pause(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	h := queenui.New(c, queenui.Options{})
	res := do(t, h, "GET", "/", nil, nil)
	if res.code != 200 {
		t.Fatalf("status %d: %s", res.code, res.body)
	}
	if strings.Contains(res.body, evilQueue) || !strings.Contains(res.body, `&lt;script&gt;alert(&#34;queue&#34;)&lt;/script&gt;</a>`) {
		t.Errorf("queue name not shown escaped")
	}
	// The link's query is URL-escaped.
	if !strings.Contains(res.body, `href="queue?name=%3cscript%3ealert%28%22queue%22%29%3c%2fscript%3e"`) {
		t.Errorf("queue link not URL-escaped:\n%s", res.body)
	}
	rows := regexp.MustCompile(`(?s)<tr>\s*<td class="name">.*?</tr>`).FindAllString(res.body, -1)
	if len(rows) != 2 {
		t.Fatalf("%d queue rows, want 2:\n%s", len(rows), res.body)
	}
	cells := regexp.MustCompile(`<td class="num">([^<]*)</td>`)
	got := func(row string) []string {
		var out []string
		for _, m := range cells.FindAllStringSubmatch(row, -1) {
			out = append(out, m[1])
		}
		return out
	}
	// Sorted by name: "<script>..." before "orders". Partitions, depth,
	// throughput (not known on the first look).
	if g := got(rows[0]); strings.Join(g, ",") != "2,3,–" {
		t.Errorf("first row numbers %v, want 2,3,–", g)
	}
	if g := got(rows[1]); strings.Join(g, ",") != "1,1,–" {
		t.Errorf("second row numbers %v, want 1,1,–", g)
	}
	// Paused before its first pop: no cursor, so not "lag 0" beside a depth of 1.
	if !strings.Contains(rows[1], "billing: paused</span>") || strings.Contains(rows[1], "billing: 0") {
		t.Errorf("paused group not shown: %s", rows[1])
	}
	if !strings.Contains(res.body, "Maintenance mode: <strong>off") {
		t.Errorf("maintenance off not shown")
	}
	if err := c.SetMaintenance(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.SetMaintenance(context.Background(), false) })
	if res := do(t, h, "GET", "/", nil, nil); !strings.Contains(res.body, "Maintenance mode: <strong>on") {
		t.Errorf("maintenance on not shown")
	}
}

func TestOverviewEmpty(t *testing.T) {
	c := queentest.Open(t)
	res := do(t, queenui.New(c, queenui.Options{}), "GET", "/", nil, nil)
	if res.code != 200 || !strings.Contains(res.body, "No queues yet") {
		t.Fatalf("status %d:\n%s", res.code, res.body)
	}
}

// post sends a same-origin form with h's token and cookie.
func post(t *testing.T, h http.Handler, ck *http.Cookie, form url.Values) resp {
	t.Helper()
	return do(t, h, "POST", "/replay", form, func(r *http.Request) {
		r.AddCookie(ck)
		r.Header.Set("Origin", "http://example.com")
	})
}

// TestReplay: one dead letter by its button, after the confirmation; a
// second submission of the same form finds it gone; then all the rest.
func TestReplay(t *testing.T) {
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

	res := post(t, h, ck, url.Values{"queue": {"orders"}, "id": {id}, "token": {token}})
	if res.code != 200 || !strings.Contains(res.body, "Dead letter "+id+" of queue") || !strings.Contains(res.body, "payload") {
		t.Fatalf("confirmation: status %d:\n%s", res.code, res.body)
	}
	confirm := url.Values{"queue": {"orders"}, "id": {id}, "token": {token}, "confirm": {"yes"}}
	res = post(t, h, ck, confirm)
	if res.code != http.StatusSeeOther || res.header.Get("Location") != "queue?name=orders&replayed=1" {
		t.Fatalf("replay: status %d, location %q:\n%s", res.code, res.header.Get("Location"), res.body)
	}
	left, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(left) != 2 || left[0].ID != dls[0].ID || left[1].ID != dls[2].ID {
		t.Fatalf("dead letters after replaying %s: %+v, %v", id, left, err)
	}
	// The message is back at the tail: offset 3 of partition p.
	msgs, err := q.Peek(ctx, queen.PeekOptions{Partition: "p", From: 3})
	if err != nil || len(msgs) != 1 || msgs[0].ID != dls[1].MessageID {
		t.Fatalf("tail after replay: %v, %v", msgs, err)
	}
	// Submitted again (a double click): gone, and nothing else replayed.
	res = post(t, h, ck, confirm)
	if res.code != http.StatusNotFound || !strings.Contains(res.body, "already replayed") {
		t.Fatalf("second replay: status %d:\n%s", res.code, res.body)
	}
	if left, _ := q.DeadLetters(ctx, queen.DeadLetterQuery{}); len(left) != 2 {
		t.Fatalf("second replay changed the dead letters: %d left", len(left))
	}
	res = do(t, h, "GET", "/queue?name=orders&replayed=1", nil, nil)
	if !strings.Contains(res.body, "Replayed 1 dead letter.") {
		t.Errorf("no notice after the replay")
	}

	// All: confirmation counts them, then both go.
	res = post(t, h, ck, url.Values{"queue": {"orders"}, "token": {token}})
	if res.code != 200 || !strings.Contains(res.body, "2 dead letters of queue") {
		t.Fatalf("confirmation of all: status %d:\n%s", res.code, res.body)
	}
	res = post(t, h, ck, url.Values{"queue": {"orders"}, "token": {token}, "confirm": {"yes"}})
	if res.code != http.StatusSeeOther || res.header.Get("Location") != "queue?name=orders&replayed=2" {
		t.Fatalf("replay all: status %d, location %q", res.code, res.header.Get("Location"))
	}
	if left, _ := q.DeadLetters(ctx, queen.DeadLetterQuery{}); len(left) != 0 {
		t.Fatalf("%d dead letters left after replaying all", len(left))
	}
	for _, bad := range []url.Values{
		{"queue": {"orders"}, "id": {"-1"}, "token": {token}},
		{"queue": {""}, "token": {token}},
	} {
		if res := post(t, h, ck, bad); res.code != http.StatusBadRequest {
			t.Errorf("form %v: status %d, want 400", bad, res.code)
		}
	}
}

// TestQueuePageGroups: the groups summed over the partitions, a paused one
// marked.
func TestQueuePageGroups(t *testing.T) {
	c := queentest.Open(t)
	ctx := ctxT(t)
	q := c.Queue("orders")
	push(t, q, queen.Item{Partition: "a", Data: []byte("1")}, queen.Item{Partition: "a", Data: []byte("2")},
		queen.Item{Partition: "b", Data: []byte("3")})
	for _, p := range []string{"a", "b"} {
		for _, g := range []string{"", "billing"} {
			msgs, err := q.Pop(ctx, queen.PopOptions{Partition: p, Group: g, Batch: 1, Wait: 5 * time.Second})
			if err != nil || len(msgs) != 1 {
				t.Fatalf("pop %s/%s: %d, %v", p, g, len(msgs), err)
			}
			if g == "billing" {
				if err := msgs[0].Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := q.Pause(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	res := do(t, queenui.New(c, queenui.Options{}), "GET", queuePath("orders"), nil, nil)
	m := regexp.MustCompile(`(?s)<table id="groups">.*?</table>`).FindString(res.body)
	rows := regexp.MustCompile(`<tr id="[^"]*"><td class="name">([^<]*)</td>\s*<td class="num">(\d+)</td><td class="num">\d+</td><td>[^<]*</td>\s*<td class="state">(?:<span class="(?:paused|abandoned)">)?(\w+)`).FindAllStringSubmatch(m, -1)
	var got []string
	for _, r := range rows {
		got = append(got, r[1]+"="+r[2]+" "+r[3])
	}
	// Queue mode holds leases on a/0 and b/0 (nothing acked): lag 3, and
	// its pops were no members, so nobody consumes it: abandoned. Billing
	// acked a/0 and b/0: lag 1.
	if want := "(queue mode)=3 abandoned,billing=1 paused"; strings.Join(got, ",") != want {
		t.Errorf("groups %q, want %q:\n%s", strings.Join(got, ","), want, m)
	}
}

// TestReplayAllIsBounded: a consumer that dead-letters every replayed
// message at once (here a trigger, in the replay's own transaction) does
// not keep "Replay all" going: it replays the dead letters there were at
// the confirmation, once each, and says how many.
func TestReplayAllIsBounded(t *testing.T) {
	c := queentest.Open(t)
	q := c.Queue("orders")
	deadLetters(t, q, "p", 3, "payload", "bad")
	ctx := ctxT(t)
	before, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(before) != 3 {
		t.Fatalf("dead letters: %d, %v", len(before), err)
	}
	dl := pgx.Identifier{c.Schema(), "dead_letters"}.Sanitize()
	fn := pgx.Identifier{c.Schema(), "dead_letter_again"}.Sanitize()
	if _, err := c.Pool().Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO `+dl+` (queue_id, partition_id, partition_name, group_name, msg_offset, message_id, transaction_id,
        message_key, message_headers, flags, payload, message_created_at, attempts, reason)
    VALUES (OLD.queue_id, OLD.partition_id, OLD.partition_name, OLD.group_name, OLD.msg_offset, OLD.message_id,
        OLD.transaction_id, OLD.message_key, OLD.message_headers, OLD.flags, OLD.payload, OLD.message_created_at,
        OLD.attempts, 'again');
    RETURN NULL;
END $$;
CREATE TRIGGER dead_letter_again AFTER DELETE ON `+dl+` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`); err != nil {
		t.Fatal(err)
	}
	h := queenui.New(c, queenui.Options{Actions: true})
	ck, token := session(t, h, queuePath("orders"))
	res := post(t, h, ck, url.Values{"queue": {"orders"}, "token": {token}})
	if res.code != 200 || !strings.Contains(res.body, "3 dead letters of queue") {
		t.Fatalf("confirmation of all: status %d:\n%s", res.code, res.body)
	}
	// The confirmed form, as the page submits it.
	form := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(res.body, -1) {
		form.Set(m[1], m[2])
	}
	if form.Get("confirm") != "yes" {
		t.Fatalf("no confirmed form in the page:\n%s", res.body)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res = do(t, h, "POST", "/replay", form, func(r *http.Request) {
		*r = *r.WithContext(rctx)
		r.AddCookie(ck)
		r.Header.Set("Origin", "http://example.com")
	})
	if res.code != http.StatusSeeOther || res.header.Get("Location") != "queue?name=orders&replayed=3" {
		t.Fatalf("replay all: status %d, location %q, want 303 with replayed=3:\n%s", res.code, res.header.Get("Location"), res.body)
	}
	// Each replayed once: offsets 3-5 of p, and the consumer's three new
	// dead letters left alone.
	st, err := q.Status(ctx)
	if err != nil || len(st.Partitions) != 1 || st.Partitions[0].LastOffset != 5 {
		t.Fatalf("status after replay all: %+v, %v; want last offset 5", st, err)
	}
	left, err := q.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(left) != 3 {
		t.Fatalf("dead letters after replay all: %d, %v; want the 3 new ones", len(left), err)
	}
	for _, d := range left {
		if d.ID <= before[2].ID || d.Reason != "again" {
			t.Fatalf("dead letter %+v left, want only the new ones", d)
		}
	}
}

// TestQueuePageCharts: the queue page charts throughput and lag from the
// samples ring that maintenance writes (here one pass's sample and two
// older ones written beside it): SVG paths with points, the axis maximum
// and the window's ends labelled; a queue without samples says so.
func TestQueuePageCharts(t *testing.T) {
	// Passes only when the test runs one.
	c := queentest.Open(t, queentest.WithConfig(func(cfg *queen.Config) { cfg.Maintenance.Interval = -1 }))
	q := c.Queue("orders")
	items := make([]queen.Item, 120)
	push(t, q, items...)
	msgs, err := q.Pop(ctxT(t), queen.PopOptions{Batch: 60})
	if err != nil || len(msgs) != 60 {
		t.Fatalf("pop: %d, %v", len(msgs), err)
	}
	if err := msgs[59].Ack(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	h := queenui.New(c, queenui.Options{})
	res := do(t, h, "GET", queuePath("orders"), nil, nil)
	if res.code != 200 || !strings.Contains(res.body, `id="chart-throughput"`) || !strings.Contains(res.body, "No samples yet") ||
		strings.Contains(res.body, "<path") {
		t.Fatalf("page before any sample: status %d, want empty charts:\n%s", res.code, res.body)
	}
	rep, err := c.Maintain(ctxT(t))
	if err != nil || rep.Samples != 1 {
		t.Fatalf("maintenance: %+v, %v; want one sample", rep, err)
	}
	// The two minutes before: 0 then 60 pushed, nothing consumed.
	s := pgx.Identifier{c.Schema()}.Sanitize()
	if _, err := c.Pool().Exec(ctxT(t), `INSERT INTO `+s+`.samples (queue_id, slot, bucket, taken_at, pushed, groups, consumed, lag)
SELECT queue_id, (slot + 60 - k) % 60, bucket - k, taken_at - k * interval '1 minute', 120 - 60 * k, groups, '{0}', '{0}'
FROM `+s+`.samples, generate_series(1, 2) k`); err != nil {
		t.Fatal(err)
	}
	res = do(t, h, "GET", queuePath("orders"), nil, nil)
	if res.code != 200 {
		t.Fatalf("status %d: %s", res.code, res.body)
	}
	paths := regexp.MustCompile(`<path class="line (s\d)" d="(M[^"]*)">`).FindAllStringSubmatch(res.body, -1)
	// pushed, settled, and the queue-mode group's lag.
	if len(paths) != 3 {
		t.Fatalf("%d chart paths, want 3:\n%s", len(paths), res.body)
	}
	for _, p := range paths {
		if !strings.Contains(p[2], " L") {
			t.Errorf("path %q has one point, want a line", p[2])
		}
	}
	for _, want := range []string{`id="chart-lag"`, `<span class="ymax">1/s</span>`, `<span class="ymax">100</span>`,
		"60 min ago", "now", "(queue mode)", `1.0/s`, `60</span>`} {
		if !strings.Contains(res.body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(res.body, "No samples yet") {
		t.Errorf("page with samples says there are none")
	}
}
