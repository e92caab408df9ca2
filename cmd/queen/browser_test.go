package main

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"math"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest"
	"github.com/e03140bc/queen/queenui"
)

// chromium finds the browser: /usr/bin/chromium (Debian's package), else
// chromium on PATH. It skips the test without one, except with CI=true.
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/chromium", "chromium"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatal("no chromium: install it (apt-get install -y chromium)")
	}
	t.Skip("no chromium: install it (apt-get install -y chromium) to run the browser test")
	return ""
}

// TestDashboardInBrowser drives the dashboard in headless Chromium against
// a schema holding hostile names and payloads: the pages show them as text
// and no injected script runs, the live part refreshes, and a dead letter
// is replayed through the confirmation step; the front page counts dead
// letters and marks the paused group; a group is paused and resumed and a
// dead letter discarded, each through its confirmation. With -update it
// saves screenshots: the queue page to testdata/dashboard.png, the front
// page, the queue page with a group paused and a discard's confirmation to
// testdata/dashboard-{overview,paused,discard}.png.
func TestDashboardInBrowser(t *testing.T) {
	path := chromium(t)
	c := queentest.Open(t)
	// A browser on a busy machine: more time than ctxT's.
	ctx, cancelAll := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancelAll()

	const (
		evilQueue   = `<img src=x onerror="window.pwned='queue'">`
		evilPayload = `{"note":"<script>window.pwned='payload'</script>"}`
		evilReason  = `<script>window.pwned='reason'</script>`
	)
	orders := c.Queue("orders")
	if err := orders.Configure(ctx, queen.QueueOptions{DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	for i, p := range []string{"eu", "us", "asia"} {
		var items []queen.Item
		for k := 0; k <= i+2; k++ {
			items = append(items, queen.Item{Partition: p, Data: []byte(`{"order":` + strconv.Itoa(k) + `}`)})
		}
		push(t, orders, items...)
	}
	push(t, orders, queen.Item{Partition: "eu", Data: []byte(evilPayload)}, queen.Item{Partition: "eu", Data: []byte("second")})
	push(t, c.Queue(evilQueue), queen.Item{Partition: `<b>bold</b>`, Data: []byte("x")})
	// eu's first three acked; then the hostile message and the next one
	// dead-lettered.
	msgs := pop(t, orders, queen.PopOptions{Partition: "eu", Batch: 3})
	if err := msgs[len(msgs)-1].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		m := pop(t, orders, queen.PopOptions{Partition: "eu", Batch: 1})
		if err := m[0].DeadLetter(ctx, errors.New(evilReason)); err != nil {
			t.Fatal(err)
		}
	}
	pop(t, orders, queen.PopOptions{Partition: "us", Batch: 2}) // a live lease
	if err := orders.Pause(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	dls, err := orders.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters: %d, %v", len(dls), err)
	}

	seedSamples(t, ctx, c, orders)

	srv := httptest.NewServer(queenui.New(c, queenui.Options{Actions: true, Refresh: 300 * time.Millisecond}))
	defer srv.Close()

	actx, cancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	bctx, cancel = context.WithTimeout(bctx, 4*time.Minute)
	defer cancel()

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// text and click find the node and use it in one evaluation: the
	// refresh replaces the live part's nodes at any moment.
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Poll[string](`(function(){var e=document.querySelector(`+strconv.Quote(sel)+
			`);return e&&e.offsetParent!==null?e.innerText:null})()`, chromedp.WithPollingTimeout(20*time.Second)))
		must("text of "+sel, err)
		return s
	}
	click := func(sel, waitFor string) {
		t.Helper()
		_, err := chromedp.Run(bctx, chromedp.Poll[bool](`(function(){var e=document.querySelector(`+strconv.Quote(sel)+
			`);if(!e||e.offsetParent===null)return false;e.click();return true})()`, chromedp.WithPollingTimeout(20*time.Second)))
		must("click "+sel, err)
		must("wait for "+waitFor, chromedp.Do(bctx, chromedp.WaitVisible(chromedp.CSS(waitFor))))
	}
	notPwned := func(where string) {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](`typeof window.pwned === "undefined" ? "clean" : String(window.pwned)`))
		must("evaluate", err)
		if v != "clean" {
			t.Errorf("%s: injected script ran: window.pwned = %q", where, v)
		}
	}

	// The queue list: both queues, the hostile name as text.
	must("navigate", chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#queues"))))
	list := text("#queues")
	for _, want := range []string{"orders", evilQueue, "billing: paused"} {
		if !strings.Contains(list, want) {
			t.Errorf("queue list lacks %q:\n%s", want, list)
		}
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#queues img, #queues script").length`)); err != nil || n != 0 {
		t.Errorf("queue list has %d img/script elements (%v)", n, err)
	}
	notPwned("queue list")
	if n := text(`#queues a[href="queue?name=orders#dead-letters-h"]`); n != "2" {
		t.Errorf("dead-letter count of orders on the front page: %q, want 2", n)
	}
	screenshot := func(name string) {
		t.Helper()
		shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		must("screenshot", err)
		if _, err := png.Decode(bytes.NewReader(shot)); err != nil {
			t.Fatalf("screenshot is not a PNG: %v", err)
		}
		if *update {
			must("write screenshot", os.WriteFile(filepath.Join("testdata", name), shot, 0o644))
		}
	}
	screenshot("dashboard-overview.png")

	// The queue page, reached by its link.
	click(`a[href="queue?name=orders"]`, "#dead-letters")
	if h := text("#queue-name"); h != "orders" {
		t.Errorf("heading %q, want orders", h)
	}
	parts := text("#partitions")
	for _, want := range []string{"asia", "eu", "us", "(queue mode)"} {
		if !strings.Contains(parts, want) {
			t.Errorf("partitions lack %q:\n%s", want, parts)
		}
	}
	dead := text("#dead-letters")
	for _, want := range []string{evilPayload, evilReason, "second"} {
		if !strings.Contains(dead, want) {
			t.Errorf("dead letters lack %q:\n%s", want, dead)
		}
	}
	if s := text("#paused-banner"); !strings.Contains(s, "Paused: group billing.") {
		t.Errorf("paused banner %q", s)
	}
	if s := text("#dead-count"); s != "(2)" {
		t.Errorf("dead-letter count %q, want (2)", s)
	}
	// The charts: SVG paths with a point for each minute of the hour.
	for _, sel := range []string{"#chart-throughput path.line", "#chart-lag path.line"} {
		n, err := chromedp.Run(bctx, chromedp.Poll[int](`(function(){var e=document.querySelector(`+strconv.Quote(sel)+
			`);if(!e||e.getBBox().width===0)return 0;return (e.getAttribute("d").match(/[ML]/g)||[]).length})()`,
			chromedp.WithPollingTimeout(20*time.Second)))
		must("points of "+sel, err)
		if n < 50 {
			t.Errorf("%s has %d points, want one a minute over the hour", sel, n)
		}
	}
	if s := text("#chart-throughput"); !strings.Contains(s, "60 min ago") || !strings.Contains(s, "now") || !strings.Contains(s, "/s") {
		t.Errorf("throughput chart's labels: %q", s)
	}
	// The live part refreshes (the script loaded under the page's
	// Content-Security-Policy and its fetch works), and still nothing ran.
	_, err = chromedp.Run(bctx, chromedp.Poll[bool](`(document.getElementById("refreshed").textContent || "").startsWith("updated")`,
		chromedp.WithPollingTimeout(20*time.Second)))
	must("wait for a refresh", err)
	notPwned("queue page after refresh")

	screenshot("dashboard.png")

	// Replay the hostile dead letter: its button leads to the confirmation
	// page, which changes nothing until confirmed.
	id := strconv.FormatInt(dls[0].ID, 10)
	click("#dl-"+id+" button.replay", "#confirm")
	if what := text("#confirm-what"); !strings.Contains(what, "Dead letter "+id+" of queue orders") {
		t.Errorf("confirmation says %q", what)
	}
	notPwned("confirmation page")
	if left, _ := orders.DeadLetters(ctx, queen.DeadLetterQuery{}); len(left) != 2 {
		t.Fatalf("%d dead letters before confirming, want 2", len(left))
	}
	click("#confirm", "#replayed")
	if s := text("#replayed"); s != "Replayed 1 dead letter." {
		t.Errorf("notice %q", s)
	}
	left, err := orders.DeadLetters(ctx, queen.DeadLetterQuery{})
	if err != nil || len(left) != 1 || left[0].ID != dls[1].ID {
		t.Fatalf("dead letters after the replay: %+v, %v", left, err)
	}
	// Back at the tail of eu (offsets 0-4 were pushed), as the same message.
	tail, err := orders.Peek(ctx, queen.PeekOptions{Partition: "eu", From: 5})
	if err != nil || len(tail) != 1 || tail[0].ID != dls[0].MessageID || string(tail[0].Data) != evilPayload {
		t.Fatalf("eu's tail after the replay: %v, %v", tail, err)
	}
	notPwned("after the replay")

	// Pause queue mode from its row, confirm; the banner names it; resume.
	click(`tr[id="group-"] button.pause`, "#confirm")
	if s := text("h1"); s != "Pause group (queue mode)?" {
		t.Errorf("pause confirmation heading %q", s)
	}
	if groupPaused(t, orders, "") {
		t.Fatal("the confirmation page paused the group")
	}
	click("#confirm", "#notice")
	if s := text("#paused-banner"); !strings.Contains(s, "Paused: groups (queue mode), billing.") {
		t.Errorf("paused banner %q", s)
	}
	if !groupPaused(t, orders, "") {
		t.Fatal("queue mode not paused after the confirmation")
	}
	screenshot("dashboard-paused.png")
	click(`tr[id="group-"] button.resume`, "#confirm")
	click("#confirm", "#notice")
	if s := text("#notice"); s != "Resumed group (queue mode)." {
		t.Errorf("notice %q", s)
	}
	if groupPaused(t, orders, "") {
		t.Fatal("queue mode still paused after the resume")
	}

	// Discard the other dead letter by its button, after the confirmation.
	id = strconv.FormatInt(dls[1].ID, 10)
	click("#discard-"+id, "#confirm")
	if what := text("#confirm-what"); !strings.Contains(what, "Dead letter "+id+" of queue orders") || !strings.Contains(what, "deleted for good") {
		t.Errorf("discard confirmation says %q", what)
	}
	screenshot("dashboard-discard.png")
	if left, _ := orders.DeadLetters(ctx, queen.DeadLetterQuery{}); len(left) != 1 {
		t.Fatalf("%d dead letters before confirming the discard, want 1", len(left))
	}
	click("#confirm", "#discarded")
	if s := text("#discarded"); s != "Discarded 1 dead letter." {
		t.Errorf("notice %q", s)
	}
	if left, err := orders.DeadLetters(ctx, queen.DeadLetterQuery{}); err != nil || len(left) != 0 {
		t.Fatalf("dead letters after the discard: %d, %v", len(left), err)
	}
	notPwned("after the discard")
}

// seedSamples gives q an hour of history in the samples ring, ending at
// a sample the background maintenance takes of it now: as if it had been
// pushed to at 20-60 messages a second and consumed a little slower, then
// faster, for the hour, its lag rising and falling back to today's (the
// real sample is then its last point).
func seedSamples(t *testing.T, ctx context.Context, c *queen.Client, q *queen.Queue) {
	t.Helper()
	s := pgx.Identifier{c.Schema()}.Sanitize()
	// A sample of this minute may predate the pushes: have the next pass
	// take one again.
	var reset time.Time
	if err := c.Pool().QueryRow(ctx, "UPDATE "+s+".samples_clock SET bucket = -1 RETURNING clock_timestamp()").Scan(&reset); err != nil {
		t.Fatal(err)
	}
	var now queen.Sample
	for deadline := time.Now().Add(30 * time.Second); ; {
		got, err := q.Samples(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(got.Samples); n > 0 && got.Samples[n-1].At.After(reset) {
			now = got.Samples[n-1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no sample of the queue 30s after Open")
		}
		time.Sleep(100 * time.Millisecond)
	}
	groups := make([]string, len(now.Groups))
	consumed := make([]int64, len(now.Groups))
	for i, g := range now.Groups {
		groups[i], consumed[i] = g.Group, g.Consumed
	}
	pushed := now.Pushed
	for k := 1; k < queen.SamplesKept; k++ {
		// The minute after this sample: its rates.
		in := 40 + 20*math.Sin(float64(k)/7)
		out := in - 12*math.Cos(float64(k)/9)
		pushed -= int64(in * 60)
		lag := make([]int64, len(groups))
		for i := range consumed {
			consumed[i] -= int64(out * 60)
			lag[i] = now.Groups[i].Lag + int64(900*(1-math.Cos(float64(k)/9)))
		}
		if _, err := c.Pool().Exec(ctx, `INSERT INTO `+s+`.samples AS x (queue_id, slot, bucket, taken_at, pushed, groups, consumed, lag)
SELECT x.queue_id, (x.bucket - $1) % 60, x.bucket - $1, x.taken_at - $1 * interval '1 minute', $2, $3, $4, $5
FROM `+s+`.samples x JOIN `+s+`.queues q ON q.id = x.queue_id
WHERE q.name = $6 AND x.taken_at = $7
ON CONFLICT (queue_id, slot) DO UPDATE SET bucket = excluded.bucket, taken_at = excluded.taken_at,
    pushed = excluded.pushed, groups = excluded.groups, consumed = excluded.consumed, lag = excluded.lag`,
			k, pushed, groups, consumed, lag, q.Name(), now.At); err != nil {
			t.Fatal(err)
		}
	}
}

// groupPaused reports whether Queue.Status shows group paused.
func groupPaused(t *testing.T, q *queen.Queue, group string) bool {
	t.Helper()
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		for _, g := range p.Groups {
			if g.Group == group {
				return g.Paused
			}
		}
	}
	t.Fatalf("group %q not in the status", group)
	return false
}
