package queenui

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/e03140bc/queen"
)

// groupConfirmPage confirms an action on one consumer group.
type groupConfirmPage struct {
	base
	Queue  string
	Group  string
	Action string // "pause" or "resume"
}

// pauseResume confirms, then pauses or resumes a consumer group (form
// fields queue and group; "" is queue mode).
func (h *handler) pauseResume(w http.ResponseWriter, r *http.Request, pause bool) {
	f := r.PostForm
	name, group := f.Get("queue"), f.Get("group")
	if name == "" {
		h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "The form names no queue."})
		return
	}
	action, title := "resume", "Resume"
	if pause {
		action, title = "pause", "Pause"
	}
	if f.Get("confirm") != "yes" {
		h.page(w, r, http.StatusOK, "confirm-group", groupConfirmPage{base: h.base(w, r, title), Queue: name, Group: group, Action: action})
		return
	}
	q := h.c.Queue(name)
	var err error
	if pause {
		err = q.Pause(r.Context(), group)
	} else {
		err = q.Resume(r.Context(), group)
	}
	if err != nil {
		h.fail(w, r, action, err)
		return
	}
	seeOther(w, "queue?name="+urlQuery(name)+"&"+action+"d="+urlQuery(group))
}

// discardConfirmPage confirms a discard of dead letters.
type discardConfirmPage struct {
	base
	Queue  string
	ID     int64 // 0: those Filter selects
	Letter *deadLetterRow
	Filter discardFilter
	Count  int
	More   bool  // Count is a lower bound
	Max    int64 // the highest dead letter id at the confirmation
}

// discardFilter is what a discard of several dead letters selects: the
// filters replay takes on the command line, empty for all.
type discardFilter struct {
	Group     string
	AnyGroup  bool // Group unset: every group
	Partition string
	Since     string // RFC 3339; "": no bound
	Until     string
}

func (d discardFilter) query() (queen.DeadLetterQuery, error) {
	var o queen.DeadLetterQuery
	if !d.AnyGroup {
		o.Groups = []string{d.Group}
	}
	o.Partition = d.Partition
	var err error
	if d.Since != "" {
		if o.Since, err = time.Parse(time.RFC3339, d.Since); err != nil {
			return o, fmt.Errorf("since: not an RFC 3339 time: %q", d.Since)
		}
	}
	if d.Until != "" {
		if o.Until, err = time.Parse(time.RFC3339, d.Until); err != nil {
			return o, fmt.Errorf("until: not an RFC 3339 time: %q", d.Until)
		}
	}
	return o, nil
}

// Filtered reports a filter narrower than every dead letter.
func (d discardFilter) Filtered() bool {
	return !d.AnyGroup || d.Partition != "" || d.Since != "" || d.Until != ""
}

// discard confirms, then deletes one dead letter (form field id) or those
// the filters select (group, partition, since, until; absent: all) up to
// the highest id there was at the confirmation (form field max), leaving
// alone what is dead-lettered meanwhile.
func (h *handler) discard(w http.ResponseWriter, r *http.Request) {
	f := r.PostForm
	name := f.Get("queue")
	if name == "" {
		h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "The form names no queue."})
		return
	}
	var id int64
	if s := f.Get("id"); s != "" {
		var err error
		if id, err = strconv.ParseInt(s, 10, 64); err != nil || id <= 0 {
			h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "The dead letter id must be a positive integer."})
			return
		}
	}
	// The group is field group when given; the queue page's select is
	// field g: "*" for every group, "=" and the name for one ("" is queue
	// mode, so an empty group cannot mean every group).
	filter := discardFilter{Group: f.Get("group"), AnyGroup: !f.Has("group"),
		Partition: f.Get("partition"), Since: f.Get("since"), Until: f.Get("until")}
	if g := f.Get("g"); strings.HasPrefix(g, "=") {
		filter.Group, filter.AnyGroup = g[1:], false
	}
	query, err := filter.query()
	if err != nil {
		h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: err.Error()})
		return
	}
	q := h.c.Queue(name)
	ctx := r.Context()
	var one *queen.DeadLetter
	if id > 0 {
		d, err := h.deadLetter(ctx, q, id)
		if err != nil {
			h.fail(w, r, "read dead letter", err)
			return
		}
		if d == nil {
			h.page(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found",
				Message: fmt.Sprintf("Dead letter %d of queue %q is not in the store (already replayed or discarded?).", id, name)})
			return
		}
		one, query = d, exactly(d)
	}
	if f.Get("confirm") != "yes" {
		p := discardConfirmPage{base: h.base(w, r, "Discard"), Queue: name, ID: id, Filter: filter}
		if one != nil {
			row := deadLetterRow{ID: one.ID, Partition: one.Partition, Group: one.Group, Offset: one.Offset,
				Attempts: one.Attempts, Reason: one.Reason, DeadAt: one.DeadAt, Size: len(one.Data)}
			row.Preview, row.Binary = Preview(one.Data, 200)
			if one.Err != nil {
				row.Preview = "(undecodable: " + one.Err.Error() + ")"
			}
			p.Letter, p.Count = &row, 1
			h.page(w, r, http.StatusOK, "confirm-discard", p)
			return
		}
		qi, err := h.queueInfo(ctx, name)
		if err != nil {
			h.fail(w, r, "count dead letters", err)
			return
		}
		if qi != nil {
			p.Max = qi.LastDeadLetterID
		}
		var n int64
		if !filter.Filtered() {
			if qi != nil {
				n = qi.DeadLetters
			}
		} else if p.Max > 0 {
			query.MaxID = p.Max
			if n, err = h.countDeadLetters(ctx, q, query); err != nil {
				h.fail(w, r, "count dead letters", err)
				return
			}
		}
		p.Count, p.More = int(min(n, countMax)), n > countMax
		h.page(w, r, http.StatusOK, "confirm-discard", p)
		return
	}
	total := 0
	if one != nil {
		if total, err = q.DiscardDeadLetters(ctx, query); err != nil {
			h.fail(w, r, "discard", err)
			return
		}
	} else {
		maxID, err := strconv.ParseInt(f.Get("max"), 10, 64)
		if err != nil || maxID < 0 {
			h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "The highest dead letter id must be a non-negative integer."})
			return
		}
		// MaxID 0 (there was nothing) would mean no bound: discard nothing.
		query.MaxID, query.Limit = maxID, 1000
		for maxID > 0 {
			n, err := q.DiscardDeadLetters(ctx, query)
			if err != nil {
				h.fail(w, r, fmt.Sprintf("discard (after %d discarded)", total), err)
				return
			}
			total += n
			if n == 0 {
				break
			}
		}
	}
	seeOther(w, "queue?name="+urlQuery(name)+"&discarded="+strconv.Itoa(total))
}

// countDeadLetters counts what o selects, at most countMax+1.
func (h *handler) countDeadLetters(ctx context.Context, q *queen.Queue, o queen.DeadLetterQuery) (int64, error) {
	o.Limit, o.After = 10_000, 0
	var n int64
	for n <= countMax {
		dls, err := q.DeadLetters(ctx, o)
		if err != nil {
			return 0, err
		}
		n += int64(len(dls))
		if len(dls) < o.Limit {
			break
		}
		o.After = dls[len(dls)-1].ID
	}
	return n, nil
}

// seeOther redirects to a relative location, as every link here:
// http.Redirect would make it absolute from the path the handler sees,
// losing the prefix it is mounted at.
func seeOther(w http.ResponseWriter, loc string) {
	w.Header().Set("Location", loc)
	w.WriteHeader(http.StatusSeeOther)
}
