package queen

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/stmt"
)

// DeadLetterQuery filters and pages Queue.DeadLetters. The zero value lists
// the first page of every dead letter of the queue.
type DeadLetterQuery struct {
	// Groups keeps only these consumer groups ("" is queue mode). Defaults
	// to nil: every group.
	Groups []string
	// Partition keeps only this partition. Defaults to "": every partition.
	Partition string
	// Since keeps dead letters stored at or after it. Defaults to zero: no
	// lower bound.
	Since time.Time
	// Until keeps dead letters stored before it. Defaults to zero: no upper
	// bound.
	Until time.Time
	// After pages: only dead letters with an ID above it, so pass the last
	// ID of the previous page. Defaults to 0: from the start.
	After int64
	// Limit is the page size. Defaults to 100; at most 10,000.
	Limit int
	// IDs keeps only these dead letters (DeadLetter.ID), for acting on
	// exactly the ones a listing showed; an empty, non-nil list keeps none.
	// Defaults to nil: every one.
	IDs []int64
	// MaxID keeps only dead letters with an ID up to it: pass the highest
	// ID seen (QueueInfo.LastDeadLetterID) to act on what was there then
	// and not on what is dead-lettered meanwhile. Defaults to 0: no upper
	// bound. Negative is an error.
	MaxID int64
}

// DeadLetter is a message that was dead-lettered, with a snapshot of its
// payload taken at that time (retention cannot lose it).
type DeadLetter struct {
	ID            int64 // increasing; page with DeadLetterQuery.After
	Queue         string
	Partition     string
	Group         string
	Offset        int64
	MessageID     uuid.UUID
	TransactionID string
	Key           string // the message's ordering key; "" for none
	// Headers are the message's headers (Item.Headers); nil for none.
	Headers   map[string]string
	Data      []byte // the plaintext, also for encrypted queues
	CreatedAt time.Time
	Attempts  int    // explicit failures charged when it was dead-lettered
	Reason    string // the error passed to Fail or DeadLetter; "" if none
	DeadAt    time.Time
	// Err is why this one could not be decoded: its payload is sealed with
	// a key the client does not hold, or does not open with it (an
	// ErrEncryption), or its stored headers are malformed. Data (and for
	// malformed headers, Headers) is then nil; the other fields are as
	// stored, so it can still be requeued or discarded by ID. nil for a
	// dead letter listed whole.
	Err error
}

// limit is the page size: Limit, 100 when unset, at most 10,000.
func (o DeadLetterQuery) limit() int {
	if o.Limit <= 0 {
		return 100
	}
	return min(o.Limit, 10_000)
}

// page is the query on q as the statements take it (NULL for an unset
// filter).
func (o DeadLetterQuery) page(q *Queue) stmt.DeadLetterPage {
	p := stmt.DeadLetterPage{Queue: stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, Groups: o.Groups,
		After: o.After, Limit: o.Limit, IDs: o.IDs}
	if o.Partition != "" {
		p.Partition = &o.Partition
	}
	if !o.Since.IsZero() {
		p.Since = &o.Since
	}
	if !o.Until.IsZero() {
		p.Until = &o.Until
	}
	if o.MaxID > 0 {
		p.MaxID = &o.MaxID
	}
	return p
}

// check refuses a query no dead letter could be meant by.
func (o DeadLetterQuery) check() error {
	if o.MaxID < 0 {
		return fmt.Errorf("queen: DeadLetterQuery.MaxID %d is negative", o.MaxID)
	}
	return nil
}

// checkDeadLetterCall is what every call over a DeadLetterQuery checks
// first: the client open, the queue's name, the query; it fills in the
// default Limit.
func (q *Queue) checkDeadLetterCall(o *DeadLetterQuery) error {
	if q.c.e.isClosed() {
		return ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return err
	}
	if err := o.checkFilters(); err != nil {
		return err
	}
	if err := o.check(); err != nil {
		return err
	}
	o.Limit = o.limit()
	return nil
}

// DeadLetters lists the queue's dead letters in ID order (oldest first).
// One it cannot decode (see DeadLetter.Err) is listed with Err set rather
// than failing the page.
func (q *Queue) DeadLetters(ctx context.Context, o DeadLetterQuery) ([]DeadLetter, error) {
	e := q.c.e
	if err := q.checkDeadLetterCall(&o); err != nil {
		return nil, err
	}
	rows, err := stmt.DeadLetters(ctx, e.csql, e.pool, o.page(q))
	if err != nil {
		return nil, fmt.Errorf("queen: dead letters of %q: %w", q.name, err)
	}
	var out []DeadLetter
	for _, r := range rows {
		d := DeadLetter{
			ID: r.ID, Queue: q.name, Partition: r.Partition, Group: r.Group, Offset: r.Offset, MessageID: r.MessageID,
			TransactionID: r.TransactionID, Key: r.Key, Data: r.Payload, CreatedAt: r.CreatedAt, Attempts: int(r.Attempts),
			DeadAt: r.DeadAt,
		}
		if r.Reason != nil {
			d.Reason = *r.Reason
		}
		// One that does not decode is listed with Err: the page, and the
		// dead letters after it, stay readable.
		if d.Headers, err = frame.DecodeHeaders(r.Headers); err != nil {
			d.Headers, d.Data, d.Err = nil, nil, fmt.Errorf("queen: dead letter %d: headers: %w", d.ID, err)
		} else if byte(r.Flags)&frame.FlagEncrypted != 0 {
			if d.Data, err = e.keys.Open(q.c.tenant, q.name, d.Partition, d.Key, r.Headers, d.MessageID, d.Data); err != nil {
				d.Data, d.Err = nil, fmt.Errorf("queen: dead letter %d: %w", d.ID, err)
			}
		}
		out = append(out, d)
	}
	return out, nil
}
