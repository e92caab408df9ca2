package queenui

import (
	"context"
	"net/url"

	"github.com/e03140bc/queen"
)

// listQueues returns the rows of the overview and, per queue, how many
// messages it was ever given (for the throughput).
func (h *handler) listQueues(ctx context.Context) ([]queueRow, map[string]int64, error) {
	qs, err := h.c.Queues(ctx)
	if err != nil {
		return nil, nil, err
	}
	out := make([]queueRow, len(qs))
	totals := make(map[string]int64, len(qs))
	for i, q := range qs {
		totals[q.Name] = q.Pushed
		r := queueRow{Name: q.Name, Partitions: q.Partitions, Depth: q.Depth, OldestAge: q.OldestAge, DeadLetters: q.DeadLetters}
		for _, g := range q.Groups {
			r.Groups = append(r.Groups, groupRow{Name: g.Group, Lag: g.Lag, LagAge: g.LagAge, Paused: g.Paused})
			if g.Paused {
				r.Paused++
			}
		}
		out[i] = r
	}
	return out, totals, nil
}

// samples is the queue's last hour from the samples ring, for its charts.
func (h *handler) samples(ctx context.Context, q *queen.Queue) (queen.QueueSamples, error) {
	return q.Samples(ctx)
}

func (h *handler) requeue(ctx context.Context, q *queen.Queue, o queen.DeadLetterQuery) (int, error) {
	return q.RequeueDeadLetters(ctx, o)
}

func urlQuery(s string) string { return url.QueryEscape(s) }
