package queenui

import (
	"context"
	"errors"
	"net/url"

	"github.com/e03140bc/queen"
)

// errNoOps stands in for the operator API until it is merged.
var errNoOps = errors.New("queenui: not available in this build")

func (h *handler) listQueues(ctx context.Context) ([]queueRow, error) { return nil, errNoOps }

func (h *handler) requeue(ctx context.Context, q *queen.Queue, o queen.DeadLetterQuery) (int, error) {
	return 0, errNoOps
}

func urlQuery(s string) string { return url.QueryEscape(s) }
