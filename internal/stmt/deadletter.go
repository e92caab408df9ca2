package stmt

import (
	"context"
	"errors"
	"time"

	"github.com/gofrs/uuid/v5"
)

// DeadLetterPage selects a page of a queue's dead letters, in id order,
// for DeadLetters, RequeueCandidates and DiscardDeadLetters. Every filter
// that is nil keeps all.
type DeadLetterPage struct {
	Queue  QueueRef
	Groups []string // "" is queue mode
	// Partition keeps the dead letters of the partition of that name.
	Partition *string
	// Since and Until keep those dead-lettered at or after Since and
	// before Until.
	Since, Until *time.Time
	// After keeps ids above it (0: from the start); Limit is the page size.
	After int64
	Limit int
	// IDs keeps those ids (empty, not nil: none); MaxID ids up to it. A
	// previous release's statements (see Use) take neither.
	IDs   []int64
	MaxID *int64
}

// DeadLetterRow is one row of DeadLetters.
type DeadLetterRow struct {
	ID            int64
	Partition     string
	Group         string
	Offset        int64
	MessageID     uuid.UUID
	TransactionID string
	Flags         int32 // the frame's flags (internal/frame)
	// Payload is as stored: sealed when Flags says so.
	Payload   []byte
	CreatedAt time.Time // when the message was pushed
	Attempts  int32     // failures charged when it was dead-lettered
	Reason    *string
	DeadAt    time.Time
	Key       string // "" for none
	Headers   []byte // encoded (frame.EncodeHeaders)
}

// DeadLetters runs c.DeadLetters for page on q.
func DeadLetters(ctx context.Context, c *Consume, q Querier, page DeadLetterPage) ([]DeadLetterRow, error) {
	rows, err := q.Query(ctx, c.DeadLetters, prefixArgs(c.DeadLetters, page.Queue.Tenant, page.Queue.Name, page.Groups,
		page.Partition, page.Since, page.Until, page.After, page.Limit, page.IDs, page.MaxID)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []DeadLetterRow
	for rows.Next() {
		var d DeadLetterRow
		if err := rows.Scan(&d.ID, &d.Partition, &d.Group, &d.Offset, &d.MessageID, &d.TransactionID, &d.Flags,
			&d.Payload, &d.CreatedAt, &d.Attempts, &d.Reason, &d.DeadAt, &d.Key, &d.Headers); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// RequeueCandidate is one row of RequeueCandidates: what a dead letter's
// re-enqueue segment needs.
type RequeueCandidate struct {
	ID            int64
	TransactionID string
	// Reseal: the queue is encrypted and the dead letter is not, so the
	// client seals it before it is appended.
	Reseal bool
	// Payload is as stored; a previous release's statement (see Use)
	// returns it only with Reseal.
	Payload   []byte
	Partition string
	MessageID uuid.UUID
	Key       string // "" for none
	Headers   []byte // encoded (frame.EncodeHeaders)
	Flags     int32  // the frame's flags (internal/frame)
}

// RequeueCandidates runs c.RequeueCandidates for page on q; encrypted says
// whether the queue is (QueueIDEnc).
func RequeueCandidates(ctx context.Context, c *Consume, q Querier, page DeadLetterPage, encrypted bool) ([]RequeueCandidate, error) {
	rows, err := q.Query(ctx, c.RequeueCandidates, prefixArgs(c.RequeueCandidates, page.Queue.Tenant, page.Queue.Name,
		page.Groups, page.Partition, page.Since, page.Until, page.After, page.Limit, encrypted, page.IDs, page.MaxID)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []RequeueCandidate
	for rows.Next() {
		var r RequeueCandidate
		if err := rows.Scan(&r.ID, &r.TransactionID, &r.Reseal, &r.Payload, &r.Partition, &r.MessageID, &r.Key,
			&r.Headers, &r.Flags); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// RequeueParams is one dead letter for Requeue.
type RequeueParams struct {
	ID   int64
	Hash []byte // the dedup hash of its transaction id
	// Payload and Flags replace the stored ones for a dead letter the
	// client sealed (Reseal); nil otherwise.
	Payload []byte
	Flags   *int32
	// Segment is the segment its copy appends (a previous release's
	// statement, see Use, builds it itself).
	Segment []byte
}

// RequeueRow is one row of Requeue: how many copies a partition got.
type RequeueRow struct {
	Partition string
	Requeued  int32
}

// Requeue runs c.Requeue for the dead letters in of queue queueID on q:
// it appends their copies and deletes them, in one statement.
func Requeue(ctx context.Context, c *Consume, q Querier, queueID int64, in []RequeueParams) ([]RequeueRow, error) {
	n := len(in)
	var (
		ids      = make([]int64, n)
		hashes   = make([][]byte, n)
		payloads = make([][]byte, n)
		flags    = make([]*int32, n)
		blobs    = make([][]byte, n)
	)
	for i, p := range in {
		ids[i], hashes[i], payloads[i], flags[i], blobs[i] = p.ID, p.Hash, p.Payload, p.Flags, p.Segment
	}
	rows, err := q.Query(ctx, c.Requeue, prefixArgs(c.Requeue, queueID, ids, hashes, payloads, flags, blobs)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []RequeueRow
	for rows.Next() {
		var r RequeueRow
		if err := rows.Scan(&r.Partition, &r.Requeued); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	rows.Close()
	return out, rows.Err()
}

// DiscardDeadLetters runs c.DiscardDeadLetters for page on q: it deletes
// the dead letters the page selects, in one statement, and returns how
// many it deleted. A previous release has no such statement (see Use):
// ErrUnsupported then.
func DiscardDeadLetters(ctx context.Context, c *Consume, q Querier, page DeadLetterPage) (int64, error) {
	if c.DiscardDeadLetters == "" {
		return 0, errors.ErrUnsupported
	}
	var n int64
	err := scanPrefix(ctx, q, c.DiscardDeadLetters, []any{page.Queue.Tenant, page.Queue.Name, page.Groups, page.Partition,
		page.Since, page.Until, page.After, page.Limit, page.IDs, page.MaxID}, &n)
	return n, err
}
