package queen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/internal/frame"
)

// popRescan is how often a waiting Pop looks again without a wake: the
// correctness floor that turns a missed wake into a delay, never a stranded
// message. It also paces DelayedProcessing and WindowBuffer, which no push
// wakes.
var popRescan = 250 * time.Millisecond

// MaxBatch caps PopOptions.Batch.
const MaxBatch = 100_000

func (o PopOptions) withDefaults() (PopOptions, error) {
	if o.Group != "" && !validName(o.Group) {
		return o, fmt.Errorf("%w: group %q", ErrInvalidName, o.Group)
	}
	if o.Partition != "" && !validName(o.Partition) {
		return o, fmt.Errorf("%w: partition %q", ErrInvalidName, o.Partition)
	}
	if o.Batch < 0 || o.Partitions < 0 || o.Wait < 0 || o.LeaseTime < 0 {
		return o, fmt.Errorf("queen: PopOptions: Batch, Partitions, Wait and LeaseTime must not be negative")
	}
	if o.Batch == 0 {
		o.Batch = 1
	}
	if o.Batch > MaxBatch {
		return o, fmt.Errorf("queen: PopOptions.Batch %d exceeds MaxBatch (%d)", o.Batch, MaxBatch)
	}
	if o.Partitions == 0 {
		o.Partitions = 1
	}
	if o.LeaseTime > 0 && o.LeaseTime < time.Millisecond {
		o.LeaseTime = time.Millisecond
	}
	return o, nil
}

// Pop claims up to o.Batch messages from up to o.Partitions partitions and
// leases them (unless o.AutoAck). It never waits on a lock: partitions leased
// by other consumers are skipped. With o.Wait it parks until a push arrives
// or o.Wait passes, then returns what it found (possibly nothing, with a nil
// error). Messages of one partition come in offset order.
func (q *Queue) Pop(ctx context.Context, o PopOptions) ([]*Message, error) {
	e := q.c.e
	if e.isClosed() {
		return nil, ErrClosed
	}
	if !validName(q.name) {
		return nil, fmt.Errorf("%w: queue %q", ErrInvalidName, q.name)
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.Wait <= 0 {
		return q.popOnce(ctx, &o, nil)
	}
	// Subscribe before the first look so a push committing in between
	// still wakes this pop.
	w := e.wake.subscribe(q.c.tenant, q.name)
	defer e.wake.unsubscribe(w)
	deadline := time.NewTimer(o.Wait)
	defer deadline.Stop()
	rescan := time.NewTicker(popRescan)
	defer rescan.Stop()
	var hints []string
	for {
		msgs, err := q.popOnce(ctx, &o, hints)
		if err != nil || len(msgs) > 0 {
			return msgs, err
		}
		select {
		case <-w.ch:
			hints = w.takeHints()
		case <-rescan.C:
			hints = nil
		case <-deadline.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.ctx.Done():
			return nil, ErrClosed
		}
	}
}

// popOnce is one claim: on its own, or folded into a claim shared with
// concurrent pops of the same queue and options (see claimFusion).
func (q *Queue) popOnce(ctx context.Context, o *PopOptions, hints []string) ([]*Message, error) {
	e := q.c.e
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if e.isClosed() {
		return nil, ErrClosed
	}
	e.claims.pops.Add(1)
	if o.Partition == "" && o.Partitions == 1 {
		return e.claims.pop(ctx, q, o, hints)
	}
	groups, err := q.claim(ctx, o, hints, 1)
	return slices.Concat(groups...), err
}

// claim is one claim round trip taking up to n*o.Partitions partitions, at
// most o.Batch messages from each and n*o.Batch in all. It returns each
// claimed partition's messages, in claim order.
func (q *Queue) claim(ctx context.Context, o *PopOptions, hints []string, n int) ([][]*Message, error) {
	e := q.c.e
	var part *string
	if o.Partition != "" {
		part = &o.Partition
	}
	if hints == nil {
		hints = []string{}
	}
	mode, from := o.Subscription.sqlMode()
	e.claims.claims.Add(1)
	// The claim commits on the server even if the caller gives up, so it
	// runs to completion on a detached context: a lease nobody received
	// would stall the partition until expiry, an auto-ack would lose data.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StatementTimeout)
	defer cancel()
	rows, err := e.pool.Query(qctx, e.csql.Pop, q.c.tenant, q.name, o.Group, part, hints, n*o.Batch, n*o.Partitions,
		o.LeaseTime.Milliseconds(), o.AutoAck, e.owner, mode, from, o.Batch)
	if err != nil {
		return nil, fmt.Errorf("queen: pop %q: %w", q.name, err)
	}
	defer rows.Close()
	var (
		groups  [][]*Message
		msgs    []*Message
		scratch []byte
		decErr  error
		pid     int64
		pname   string
		lease   *uuid.UUID
		expires *time.Time
		leaseMs int64
		first   int64
		last    int64
		deliv   int32
		dmax    int64
		base    int64
		end     int64
		created time.Time
		blob    []byte
		fails   int32
	)
	for rows.Next() {
		if err := rows.Scan(&pid, &pname, &lease, &expires, &leaseMs, &first, &last, &deliv, &dmax, &base, &end, &created, &blob, &fails); err != nil {
			return nil, fmt.Errorf("queen: pop %q: %w", q.name, err)
		}
		if decErr != nil {
			continue // drain the rows; the claim has committed anyway
		}
		if len(msgs) > 0 && msgs[0].pid != pid {
			groups = append(groups, msgs)
			msgs = nil
		}
		frames, owned, err := e.segs.frames(pid, base, end, last, blob, scratch)
		if decErr = err; decErr != nil {
			continue
		}
		if owned {
			scratch = frames
		}
		var leaseID uuid.UUID
		var leaseStr string
		var exp time.Time
		var dur time.Duration
		if lease != nil {
			leaseID, leaseStr = *lease, lease.String()
		}
		if expires != nil {
			exp = *expires
			dur = time.Duration(leaseMs) * time.Millisecond
		}
		decErr = frame.DecodeRange(frames, int(max(first-base, 0)), int(last-base), func(k int, f *frame.Frame) error {
			off := base + int64(k)
			m := &Message{
				ID: f.ID, TransactionID: f.TransactionID, Queue: q.name, Partition: pname, Offset: off,
				CreatedAt: created, Group: o.Group, LeaseID: leaseStr, Attempt: 1, LeaseExpiresAt: exp,
				q: q, pid: pid, lease: leaseID, leaseDur: dur, flags: f.Flags,
			}
			if off <= dmax && deliv > 1 {
				m.Attempt = int(deliv)
			}
			// A message the skip policy re-enqueued carries its failures.
			m.Attempt += int(fails)
			m.stored = append([]byte(nil), f.Payload...)
			m.Data = m.stored
			if f.Flags&frame.FlagEncrypted != 0 {
				plain, err := e.open(q.c.tenant, q.name, pname, f.ID, f.Payload)
				if err != nil {
					return fmt.Errorf("partition %q offset %d: %w", pname, off, err)
				}
				m.Data = plain
			}
			msgs = append(msgs, m)
			return nil
		})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("queen: pop %q: %w", q.name, err)
	}
	if decErr != nil {
		// The lease stands: the messages come back after it expires, which
		// is the right outcome for a key that appears later or a transient
		// fault; a permanently corrupt segment needs an operator.
		return nil, fmt.Errorf("queen: pop %q: %w", q.name, decErr)
	}
	if len(msgs) > 0 {
		groups = append(groups, msgs)
	}
	return groups, nil
}

// newOwner names this client in lease_owner: host, process and a random
// suffix telling clients of one process apart.
func newOwner() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
