// Package queenui is a web dashboard for a queen schema: queues with depth
// and throughput, charts of each queue's throughput and lag over the last
// hour, partitions with lag, lease holders and expiry, consumer
// groups, dead letters with a payload preview, the spool and the
// maintenance flag.
//
// New returns an http.Handler that renders server-side HTML (html/template,
// assets embedded, no build step) with a little JavaScript that refreshes
// the live part of each page. It is read-only unless Options.Actions is
// set; then dead letters can be replayed or discarded and consumer groups
// paused and resumed, each POST checked against
// cross-site request forgery (a token tied to a per-handler secret and a
// SameSite cookie, and the request's origin).
//
// The handler has no authentication of its own. Serve it on a loopback
// address, or mount it behind something that authenticates:
//
//	mux.Handle("/queen/", http.StripPrefix("/queen", requireAdmin(queenui.New(client, queenui.Options{}))))
//
// Every link it renders is relative, so it works under any prefix.
package queenui

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/connstr"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configure the dashboard. The zero value is a read-only dashboard
// refreshing every 5 seconds.
type Options struct {
	// Actions enables the replay and the discard of dead letters and the
	// pause and resume of consumer groups (POST, each with a confirmation
	// step). Defaults to false: read-only, every POST is refused with 403.
	Actions bool
	// Refresh is how often a page refreshes its live part in the browser.
	// Defaults to 5s; negative turns refreshing off.
	Refresh time.Duration
	// DeadLetters is how many dead letters a queue's page lists. Defaults
	// to 50; at most 1,000.
	DeadLetters int
	// Partitions is how many partitions a queue's page lists. Defaults to
	// 500.
	Partitions int
	// Logger receives errors the pages show. Defaults to slog.Default().
	Logger *slog.Logger
}

type handler struct {
	c      *queen.Client
	opts   Options
	tmpl   *template.Template
	csrf   *csrf
	static http.Handler
	rates  rates
	origin *http.CrossOriginProtection
}

// New returns the dashboard for client's schema and tenant.
func New(client *queen.Client, opts Options) http.Handler {
	if opts.Refresh == 0 {
		opts.Refresh = 5 * time.Second
	}
	if opts.DeadLetters <= 0 {
		opts.DeadLetters = 50
	}
	opts.DeadLetters = min(opts.DeadLetters, 1000)
	if opts.Partitions <= 0 {
		opts.Partitions = 500
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	h := &handler{
		c:      client,
		opts:   opts,
		tmpl:   template.Must(template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")),
		csrf:   newCSRF(),
		origin: http.NewCrossOriginProtection(),
	}
	sub, _ := fs.Sub(staticFS, "static") // cannot fail: the directory is embedded
	h.static = http.StripPrefix("static/", http.FileServerFS(sub))
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	// Scripts and styles only from the handler itself: even markup that
	// slipped through escaping could not run a script.
	hdr.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "same-origin")
	// The routes are relative to wherever the handler is mounted.
	path := strings.TrimPrefix(r.URL.Path, "/")
	switch {
	case strings.HasPrefix(path, "static/"):
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		hdr.Set("Cache-Control", "no-cache")
		r2 := *r
		u := *r.URL
		u.Path = path
		r2.URL = &u
		h.static.ServeHTTP(w, &r2)
		return
	}
	hdr.Set("Cache-Control", "no-store")
	if r.Method == http.MethodPost {
		h.post(w, r, path)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch path {
	case "":
		h.overview(w, r)
	case "queue":
		h.queuePage(w, r)
	default:
		h.page(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found", Message: "There is no page " + r.URL.Path + " on this dashboard."})
	}
}

func (h *handler) post(w http.ResponseWriter, r *http.Request, path string) {
	if !h.opts.Actions {
		h.page(w, r, http.StatusForbidden, "error", errorPage{Title: "Read-only",
			Message: "This dashboard is read-only: actions are off (queenui.Options.Actions, queen serve --actions)."})
		return
	}
	if err := h.origin.Check(r); err != nil {
		h.page(w, r, http.StatusForbidden, "error", errorPage{Title: "Refused",
			Message: "Cross-origin request refused. Submit the form from this dashboard's own page."})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "The form could not be read."})
		return
	}
	if !h.csrf.valid(r, r.PostForm.Get("token")) {
		h.page(w, r, http.StatusForbidden, "error", errorPage{Title: "Form expired",
			Message: "The form's security token is missing or stale (the dashboard restarted, or cookies are off). Reload the page and try again."})
		return
	}
	switch path {
	case "replay":
		h.replay(w, r)
	case "discard":
		h.discard(w, r)
	case "pause", "resume":
		h.pauseResume(w, r, path == "pause")
	case "reset", "delete-group", "release":
		h.groupOp(w, r, path)
	default:
		h.page(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found", Message: "There is no action " + r.URL.Path + "."})
	}
}

// base is what every page template gets.
type base struct {
	Title   string
	Schema  string
	Tenant  string
	Refresh int64 // milliseconds; 0: off
	Actions bool
	Token   string
	Partial bool
}

type errorPage struct {
	base
	Title   string
	Message string
}

func (h *handler) base(w http.ResponseWriter, r *http.Request, title string) base {
	b := base{Title: title, Schema: h.c.Schema(), Actions: h.opts.Actions, Partial: r.Header.Get("X-Queen-Partial") == "1"}
	if t := h.c.Tenant(); t != queen.DefaultTenant {
		b.Tenant = t.String()
	}
	if h.opts.Refresh > 0 {
		b.Refresh = h.opts.Refresh.Milliseconds()
	}
	if h.opts.Actions {
		b.Token = h.csrf.token(w, r)
	}
	return b
}

// page renders into a buffer first, so a template error is a clean 500.
func (h *handler) page(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	if e, ok := data.(errorPage); ok {
		e.base = h.base(w, r, e.Title)
		data = e
	}
	var buf bytes.Buffer
	if err := h.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
		h.opts.Logger.Error("queenui: render", "page", name, "err", err)
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

func (h *handler) fail(w http.ResponseWriter, r *http.Request, what string, err error) {
	status := http.StatusInternalServerError
	if errors.Is(err, queen.ErrClosed) || errors.Is(err, context.DeadlineExceeded) {
		status = http.StatusServiceUnavailable
	}
	msg := err.Error()
	if p, ok := connstr.Problem(err); ok {
		// pgx's parse error quotes the connection string, password and all.
		msg = "database connection string: " + p
		err = errors.New(msg)
	}
	h.opts.Logger.Error("queenui: "+what, "err", err)
	h.page(w, r, status, "error", errorPage{Title: "Error", Message: what + ": " + msg})
}

type overviewPage struct {
	base
	Maintenance bool
	Spool       queen.SpoolStats
	SpoolError  string
	Queues      []queueRow
}

type queueRow struct {
	Name        string
	Partitions  int
	Depth       int64
	OldestAge   time.Duration
	DeadLetters int64
	Paused      int // how many of Groups are paused
	Groups      []groupRow
	Rate        float64 // messages pushed per second; negative: not known yet
}

type groupRow struct {
	Name   string
	Lag    int64 // settled offsets excluded: they are skipped, never read
	LagAge time.Duration
	Paused bool
	// Settled is how many offsets above the cursors were settled out of
	// order (queue page only).
	Settled int64
	// Unsubscribed: paused before its first pop, the group has no cursor
	// yet, so no lag (queue page only).
	Unsubscribed bool
	// Members is how many live members the group has; Abandoned: lag and
	// none (queue page only).
	Members   int
	Abandoned bool
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	p := overviewPage{base: h.base(w, r, "Queues"), Maintenance: h.c.Maintenance(), Spool: h.c.SpoolStats()}
	if p.Spool.LastError != nil {
		p.SpoolError = p.Spool.LastError.Error()
	}
	qs, totals, err := h.listQueues(r.Context())
	if err != nil {
		h.fail(w, r, "list queues", err)
		return
	}
	rates := h.rates.update(time.Now(), totals)
	for i := range qs {
		qs[i].Rate = -1
		if v, ok := rates[qs[i].Name]; ok {
			qs[i].Rate = v
		}
	}
	p.Queues = qs
	h.page(w, r, http.StatusOK, "overview", p)
}

type queuePage struct {
	base
	Queue       string
	Groups      []groupRow // summed over every partition
	Partitions  []partitionRow
	More        int // partitions not shown
	DeadLetters []deadLetterRow
	MoreDead    bool
	DeadCount   int64 // every dead letter of the queue
	Paused      []string
	Replayed    int // >= 0: the notice after a replay
	Discarded   int // >= 0: the notice after a discard
	Notice      string
	Maintenance bool
	Charts      []chart // throughput and lag over the samples ring's hour
}

type partitionRow struct {
	Name        string
	LastOffset  int64
	LogStart    int64
	LastWriteAt time.Time
	Groups      []queen.GroupStatus
	Paused      map[string]bool
}

type deadLetterRow struct {
	ID        int64
	Partition string
	Group     string
	Offset    int64
	Attempts  int
	Reason    string
	DeadAt    time.Time
	Preview   string
	Size      int
	Binary    bool
}

func (h *handler) queuePage(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	if name == "" {
		h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "Which queue? The address needs ?name=<queue>."})
		return
	}
	qi, err := h.queueInfo(r.Context(), name)
	if err != nil {
		h.fail(w, r, "look up queue", err)
		return
	}
	if qi == nil {
		h.page(w, r, http.StatusNotFound, "error", errorPage{Title: "Queue not found",
			Message: fmt.Sprintf("There is no queue %q in schema %q.", name, h.c.Schema())})
		return
	}
	q := h.c.Queue(name)
	st, err := q.Status(r.Context())
	if err != nil {
		h.fail(w, r, "queue status", err)
		return
	}
	p := queuePage{base: h.base(w, r, name), Queue: name, Replayed: -1, Discarded: -1, Maintenance: h.c.Maintenance(),
		DeadCount: qi.DeadLetters}
	if n, err := strconv.Atoi(r.URL.Query().Get("replayed")); err == nil && n >= 0 {
		p.Replayed = n
	}
	if n, err := strconv.Atoi(r.URL.Query().Get("discarded")); err == nil && n >= 0 {
		p.Discarded = n
	}
	switch uq := r.URL.Query(); {
	case uq.Has("paused"):
		p.Notice = "Paused group " + groupName(uq.Get("paused")) + "."
	case uq.Has("resumed"):
		p.Notice = "Resumed group " + groupName(uq.Get("resumed")) + "."
	case uq.Has("reset"):
		p.Notice = "Reset group " + groupName(uq.Get("reset")) + " to the " + uq.Get("to") + " offsets of " + uq.Get("n") + " partitions."
	case uq.Has("deleted"):
		p.Notice = "Deleted group " + groupName(uq.Get("deleted")) + "."
	case uq.Has("released"):
		if uq.Get("n") == "1" {
			p.Notice = "Released group " + groupName(uq.Get("released")) + "'s lease on partition " + uq.Get("partition") + ": its messages go to the next claim."
		} else {
			p.Notice = "Group " + groupName(uq.Get("released")) + " held no lease on partition " + uq.Get("partition") + "."
		}
	}
	p.Groups = summarize(st, qi.Groups)
	for _, g := range p.Groups {
		if g.Paused {
			p.Paused = append(p.Paused, groupName(g.Name))
		}
	}
	parts := st.Partitions
	if len(parts) > h.opts.Partitions {
		p.More = len(parts) - h.opts.Partitions
		parts = parts[:h.opts.Partitions]
	}
	for _, ps := range parts {
		p.Partitions = append(p.Partitions, partitionRow{Name: ps.Name, LastOffset: ps.LastOffset, LogStart: ps.LogStart,
			LastWriteAt: ps.LastWriteAt, Groups: ps.Groups})
	}
	samples, err := h.samples(r.Context(), q)
	if err != nil {
		h.fail(w, r, "samples", err)
		return
	}
	p.Charts = queueCharts(samples)
	dls, err := q.DeadLetters(r.Context(), queen.DeadLetterQuery{Limit: h.opts.DeadLetters + 1})
	if err != nil {
		h.fail(w, r, "dead letters", err)
		return
	}
	if len(dls) > h.opts.DeadLetters {
		p.MoreDead, dls = true, dls[:h.opts.DeadLetters]
	}
	for _, d := range dls {
		row := deadLetterRow{ID: d.ID, Partition: d.Partition, Group: d.Group, Offset: d.Offset, Attempts: d.Attempts,
			Reason: d.Reason, DeadAt: d.DeadAt, Size: len(d.Data)}
		row.Preview, row.Binary = Preview(d.Data, 200)
		if d.Err != nil {
			row.Preview = "(undecodable: " + d.Err.Error() + ")"
		}
		p.DeadLetters = append(p.DeadLetters, row)
	}
	h.page(w, r, http.StatusOK, "queue", p)
}

// summarize sums each group's lag and settled offsets over the
// partitions, keeping the oldest lag age; groups by name. Groups of info
// that no partition shows (paused before their first pop) are added as
// unsubscribed.
func summarize(st queen.QueueStatus, info []queen.QueueGroupInfo) []groupRow {
	idx := map[string]int{}
	var out []groupRow
	for _, p := range st.Partitions {
		for _, g := range p.Groups {
			i, ok := idx[g.Group]
			if !ok {
				i = len(out)
				idx[g.Group] = i
				out = append(out, groupRow{Name: g.Group})
			}
			r := &out[i]
			r.Lag += g.Lag
			r.Settled += int64(g.Settled)
			r.LagAge = max(r.LagAge, g.LagAge)
			r.Paused = r.Paused || g.Paused
		}
	}
	for _, g := range info {
		i, ok := idx[g.Group]
		if !ok {
			i = len(out)
			idx[g.Group] = i
			out = append(out, groupRow{Name: g.Group, Paused: g.Paused, Unsubscribed: true})
		}
		out[i].Members, out[i].Abandoned = len(g.Members), g.Abandoned
	}
	slices.SortFunc(out, func(a, b groupRow) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Preview renders at most max bytes of a payload for display: the text
// itself when it is valid UTF-8 (cut at a character boundary, "…" marking
// the cut), else the hex of its first bytes, with binary true. The result
// is plain text: html/template escapes it where it is shown.
func Preview(data []byte, max int) (s string, binary bool) {
	if utf8.Valid(data) {
		if len(data) <= max {
			return string(data), false
		}
		cut := max
		for cut > 0 && !utf8.RuneStart(data[cut]) {
			cut--
		}
		return string(data[:cut]) + "…", false
	}
	n := min(len(data), max/2)
	s = fmt.Sprintf("%x", data[:n])
	if n < len(data) {
		s += "…"
	}
	return s, true
}

type confirmPage struct {
	base
	Queue  string
	ID     int64 // 0: every dead letter of the queue
	Letter *deadLetterRow
	Count  int
	More   bool  // Count is a lower bound
	Max    int64 // all: the highest dead letter id counted
}

// replay confirms, then replays one dead letter (form field id) or all of
// a queue's: those up to the highest id there was at the confirmation
// (form field max), so a consumer dead-lettering the copies again at once
// cannot keep it going.
func (h *handler) replay(w http.ResponseWriter, r *http.Request) {
	f := r.PostForm
	name := f.Get("queue")
	var id int64
	if s := f.Get("id"); s != "" {
		var err error
		if id, err = strconv.ParseInt(s, 10, 64); err != nil || id <= 0 {
			h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "The dead letter id must be a positive integer."})
			return
		}
	}
	maxID := int64(-1) // not given
	if s := f.Get("max"); s != "" && id == 0 {
		var err error
		if maxID, err = strconv.ParseInt(s, 10, 64); err != nil || maxID < 0 {
			h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "The highest dead letter id must be a non-negative integer."})
			return
		}
	}
	if name == "" {
		h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "The form names no queue."})
		return
	}
	q := h.c.Queue(name)
	ctx := r.Context()
	var one *queen.DeadLetter
	query := queen.DeadLetterQuery{Limit: 1000}
	if id > 0 {
		d, err := h.deadLetter(ctx, q, id)
		if err != nil {
			h.fail(w, r, "read dead letter", err)
			return
		}
		if d == nil {
			h.page(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found",
				Message: fmt.Sprintf("Dead letter %d of queue %q is not in the store (already replayed?).", id, name)})
			return
		}
		one, query = d, exactly(d)
	}
	if f.Get("confirm") != "yes" {
		p := confirmPage{base: h.base(w, r, "Replay"), Queue: name, ID: id}
		if one != nil {
			row := deadLetterRow{ID: one.ID, Partition: one.Partition, Group: one.Group, Offset: one.Offset,
				Attempts: one.Attempts, Reason: one.Reason, DeadAt: one.DeadAt, Size: len(one.Data)}
			row.Preview, row.Binary = Preview(one.Data, 200)
			if one.Err != nil {
				row.Preview = "(undecodable: " + one.Err.Error() + ")"
			}
			p.Letter, p.Count = &row, 1
		} else {
			qi, err := h.queueInfo(ctx, name)
			if err != nil {
				h.fail(w, r, "count dead letters", err)
				return
			}
			var n int64
			if qi != nil {
				n, p.Max = qi.DeadLetters, qi.LastDeadLetterID
			}
			p.Count, p.More = int(min(n, countMax)), n > countMax
		}
		h.page(w, r, http.StatusOK, "confirm", p)
		return
	}
	if one == nil {
		if maxID < 0 {
			// A form from before the bound: what is there now.
			qi, err := h.queueInfo(ctx, name)
			if err != nil {
				h.fail(w, r, "count dead letters", err)
				return
			}
			maxID = 0
			if qi != nil {
				maxID = qi.LastDeadLetterID
			}
		}
		query.MaxID = maxID
	}
	total := 0
	// MaxID 0 (there was nothing) would mean no bound: replay nothing.
	for one != nil || query.MaxID > 0 {
		n, err := h.requeue(ctx, q, query)
		if err != nil {
			h.fail(w, r, fmt.Sprintf("replay (after %d replayed)", total), err)
			return
		}
		total += n
		if n == 0 || one != nil {
			break
		}
	}
	// Relative, as every link here: http.Redirect would make it absolute
	// from the path the handler sees, losing the prefix it is mounted at.
	w.Header().Set("Location", "queue?name="+urlQuery(name)+"&replayed="+strconv.Itoa(total))
	w.WriteHeader(http.StatusSeeOther)
}

// deadLetter finds dead letter id of q, nil if it is not there.
func (h *handler) deadLetter(ctx context.Context, q *queen.Queue, id int64) (*queen.DeadLetter, error) {
	dls, err := q.DeadLetters(ctx, queen.DeadLetterQuery{IDs: []int64{id}, Limit: 1})
	if err != nil || len(dls) == 0 {
		return nil, err
	}
	return &dls[0], nil
}

// exactly narrows a query to d alone.
func exactly(d *queen.DeadLetter) queen.DeadLetterQuery {
	return queen.DeadLetterQuery{IDs: []int64{d.ID}, Limit: 1}
}

// countMax bounds the count the confirmation of "replay all" shows.
const countMax = 100_000

// queueInfo is the queue's row of Client.Queues, or nil when it does not
// exist (Status cannot tell a queue with no partitions from a missing one).
func (h *handler) queueInfo(ctx context.Context, name string) (*queen.QueueInfo, error) {
	qs, err := h.c.Queues(ctx)
	if err != nil {
		return nil, err
	}
	for i := range qs {
		if qs[i].Name == name {
			return &qs[i], nil
		}
	}
	return nil, nil
}

// rates turns successive totals into messages per second. Samples closer
// than rateMin are not used, so many viewers refreshing at once still
// measure over a useful interval.
type rates struct {
	mu   sync.Mutex
	at   time.Time
	prev map[string]int64
	last map[string]float64
}

const rateMin = 2 * time.Second

func (r *rates) update(now time.Time, totals map[string]int64) map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.prev == nil {
		r.at, r.prev = now, totals
		return nil
	}
	dt := now.Sub(r.at)
	if dt < rateMin {
		return r.last
	}
	out := make(map[string]float64, len(totals))
	for q, n := range totals {
		if p, ok := r.prev[q]; ok && n >= p {
			// A purged idle partition lowers the total: no rate then.
			out[q] = float64(n-p) / dt.Seconds()
		}
	}
	r.at, r.prev, r.last = now, totals, out
	return out
}
