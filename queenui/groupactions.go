package queenui

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/e03140bc/queen"
)

// groupOpPage confirms a reset or delete of a consumer group, or the
// release of one lease.
type groupOpPage struct {
	base
	Queue     string
	Group     string
	Action    string // "reset", "delete-group" or "release"
	To        string // reset: "earliest" or "latest"
	Partition string // release
	Force     bool
}

// groupOp confirms, then resets a group's offsets (form field to:
// earliest or latest), deletes a group, or releases the group's lease on a
// partition. Reset and delete refuse an active group (a live lease or a
// live member) unless the form's force is "yes": the refusal is shown on
// the confirmation page, which then offers the forced action.
func (h *handler) groupOp(w http.ResponseWriter, r *http.Request, action string) {
	f := r.PostForm
	p := groupOpPage{Queue: f.Get("queue"), Group: f.Get("group"), Action: action, To: f.Get("to"),
		Partition: f.Get("partition"), Force: f.Get("force") == "yes"}
	switch {
	case p.Queue == "":
		h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "The form names no queue."})
		return
	case action == "reset" && p.To != "earliest" && p.To != "latest":
		h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "Reset to what? The form needs to=earliest or to=latest."})
		return
	case action == "release" && p.Partition == "":
		h.page(w, r, http.StatusBadRequest, "error", errorPage{Title: "Bad request", Message: "Release which lease? The form names no partition."})
		return
	}
	titles := map[string]string{"reset": "Reset group", "delete-group": "Delete group", "release": "Release lease"}
	if f.Get("confirm") != "yes" {
		p.base = h.base(w, r, titles[action])
		h.page(w, r, http.StatusOK, "confirm-groupop", p)
		return
	}
	q := h.c.Queue(p.Queue)
	var (
		err    error
		notice string
	)
	switch action {
	case "reset":
		to := queen.ResetEarliest()
		if p.To == "latest" {
			to = queen.ResetLatest()
		}
		var moves []queen.OffsetMove
		moves, err = q.ResetGroup(r.Context(), p.Group, to, queen.ResetOptions{Force: p.Force})
		notice = "reset=" + urlQuery(p.Group) + "&to=" + urlQuery(p.To) + "&n=" + strconv.Itoa(len(moves))
	case "delete-group":
		_, err = q.DeleteGroup(r.Context(), p.Group, queen.DeleteGroupOptions{Force: p.Force})
		notice = "deleted=" + urlQuery(p.Group)
	case "release":
		var released bool
		released, err = q.ReleaseLease(r.Context(), p.Group, p.Partition)
		notice = "released=" + urlQuery(p.Group) + "&partition=" + urlQuery(p.Partition) + "&n=" + strconv.Itoa(boolInt(released))
	}
	switch {
	case errors.Is(err, queen.ErrGroupActive):
		// Say why and offer the forced action.
		p.base = h.base(w, r, titles[action])
		p.Force = true
		h.page(w, r, http.StatusConflict, "confirm-groupop", p)
		return
	case errors.Is(err, queen.ErrNotFound):
		h.page(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found", Message: err.Error()})
		return
	case err != nil:
		h.fail(w, r, titles[action], err)
		return
	}
	seeOther(w, "queue?name="+urlQuery(p.Queue)+"&"+notice)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
