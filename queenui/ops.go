package queenui

import (
	"context"
	"net/url"

	"github.com/e03140bc/queen"
)

func (h *handler) listQueues(ctx context.Context) ([]queueRow, error) {
	qs, err := h.c.Queues(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]queueRow, len(qs))
	for i, q := range qs {
		r := queueRow{Name: q.Name, Partitions: q.Partitions, Depth: q.Depth, OldestAge: q.OldestAge}
		for _, g := range q.Groups {
			r.Groups = append(r.Groups, groupRow{Name: g.Group, Lag: g.Lag, LagAge: g.LagAge, Paused: g.Paused})
		}
		out[i] = r
	}
	return out, nil
}

func (h *handler) requeue(ctx context.Context, q *queen.Queue, o queen.DeadLetterQuery) (int, error) {
	return q.RequeueDeadLetters(ctx, o)
}

func urlQuery(s string) string { return url.QueryEscape(s) }
