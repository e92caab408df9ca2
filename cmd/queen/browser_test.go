package main

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

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
// is replayed through the confirmation step. It saves a screenshot of the
// queue page to testdata/dashboard.png with -update.
func TestDashboardInBrowser(t *testing.T) {
	path := chromium(t)
	c := queentest.Open(t)
	ctx := ctxT(t)

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
	bctx, cancel = context.WithTimeout(bctx, 90*time.Second)
	defer cancel()

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel), chromedp.NodeVisible))
		must("text of "+sel, err)
		return s
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
	for _, want := range []string{"orders", evilQueue, "billing: 0 (paused)"} {
		if !strings.Contains(list, want) {
			t.Errorf("queue list lacks %q:\n%s", want, list)
		}
	}
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#queues img, #queues script").length`)); err != nil || n != 0 {
		t.Errorf("queue list has %d img/script elements (%v)", n, err)
	}
	notPwned("queue list")

	// The queue page, reached by its link.
	must("open orders", chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`a[href="queue?name=orders"]`), chromedp.NodeVisible),
		chromedp.WaitVisible(chromedp.CSS("#dead-letters"))))
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
	// The live part refreshes (the script loaded under the page's
	// Content-Security-Policy and its fetch works), and still nothing ran.
	_, err = chromedp.Run(bctx, chromedp.Poll[bool](`(document.getElementById("refreshed").textContent || "").startsWith("updated")`,
		chromedp.WithPollingTimeout(20*time.Second)))
	must("wait for a refresh", err)
	notPwned("queue page after refresh")

	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	must("screenshot", err)
	if _, err := png.Decode(bytes.NewReader(shot)); err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if *update {
		must("write screenshot", os.WriteFile(filepath.Join("testdata", "dashboard.png"), shot, 0o644))
	}

	// Replay the hostile dead letter: its button leads to the confirmation
	// page, which changes nothing until confirmed.
	id := strconv.FormatInt(dls[0].ID, 10)
	must("click replay", chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#dl-"+id+" button.replay"), chromedp.NodeVisible),
		chromedp.WaitVisible(chromedp.CSS("#confirm"))))
	if what := text("#confirm-what"); !strings.Contains(what, "Dead letter "+id+" of queue orders") {
		t.Errorf("confirmation says %q", what)
	}
	notPwned("confirmation page")
	if left, _ := orders.DeadLetters(ctx, queen.DeadLetterQuery{}); len(left) != 2 {
		t.Fatalf("%d dead letters before confirming, want 2", len(left))
	}
	must("confirm", chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#confirm"), chromedp.NodeVisible),
		chromedp.WaitVisible(chromedp.CSS("#replayed"))))
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
}
