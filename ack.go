package queen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/stmt"
)

// AckStatus is the outcome a consumer reports for one message.
type AckStatus int

// Ack outcomes, in AckRequest.Status.
const (
	// AckSuccess commits the cursor through the message.
	AckSuccess AckStatus = iota
	// AckFail charges the retry budget and redelivers from the message
	// (dead-letters or drops it when the budget is spent).
	AckFail
	// AckRetry redelivers from the message without charging.
	AckRetry
	// AckDeadLetter moves the message to the dead-letter store at once.
	AckDeadLetter
)

// AckRequest is one message's outcome in AckBatch.
type AckRequest struct {
	Message *Message
	Status  AckStatus // defaults to AckSuccess
	// Reason is recorded with a dead letter; optional. With AckFail, a
	// RetryAfter reason sets the wait before the next attempt.
	Reason error
}

// settle actions and verdict statuses (see internal/stmt).
const (
	actNone       = stmt.ActNone
	actFail       = stmt.ActFail
	actRetry      = stmt.ActRetry
	actDeadLetter = stmt.ActDeadLetter
	// actInterrupt is settle()'s retry that also takes back the lease's
	// delivery: what a stopping consumer did not finish goes back
	// uncharged, and its next delivery is not counted as a retry.
	actInterrupt = stmt.ActInterrupt

	stApplied     = stmt.SettleApplied
	stBelowCursor = stmt.SettleBelowCursor
	stLeaseLost   = stmt.SettleLeaseLost
	stDeadLetter  = stmt.SettleDeadLettered
	stDropped     = stmt.SettleDropped
	stUnknown     = stmt.SettleUnknown
)

// settleOp is one lease's settlement: commit through ok, then act on act.
// With keyed set it is an out-of-order settlement instead (settle_keyed):
// one outcome per message, ok, act and actMsg unused.
type settleOp struct {
	m       *Message // any message of the lease: partition, group, lease
	ok      int64
	act     int16
	actMsg  *Message // the acted-on message; nil with actNone
	release bool
	reason  storedReason
	// delay is, with actFail, the wait before the next attempt the
	// handler asked for (RetryAfter); 0: the queue's RetryBackoff.
	delay time.Duration
	keyed []keyedRow
}

// failOp is the settlement of m's failure for reason: the lease's
// earlier messages complete, m is charged and waits what reason asks
// (RetryAfter) or the queue's RetryBackoff.
func failOp(m *Message, reason error) settleOp {
	return settleOp{m: m, ok: -1, act: actFail, actMsg: m, reason: reasonText(reason), delay: retryDelay(reason)}
}

// keyedRow is one message's outcome in an out-of-order settlement.
type keyedRow struct {
	m      *Message // with actCarry and actPark, the batch's last message
	act    int16    // actNone (ack), actFail, actRetry, actDeadLetter, actInterrupt, actCarry or actPark
	reason storedReason
	// delay is, with actFail, the wait the handler asked for (RetryAfter)
	// before the next attempt; 0: the queue's RetryBackoff.
	delay time.Duration
}

// actCarry is settle_keyed's row without an outcome: it carries a lease's
// release.
const actCarry = stmt.ActCarry

// actPark is actCarry from a batch left with waiting keys only: the
// release also parks the partition (see settle_keyed_v2).
const actPark = stmt.ActPark

// actHeld notes a message a keyed batch did not start because an earlier
// message of its key waits (see settle_keyed_v2).
const actHeld = stmt.ActHeld

// stRequeued is settle_keyed's status of a failure the skip policy
// re-enqueued at the tail (settle reports it as stApplied).
const stRequeued = stmt.SettleRequeued

func statusErr(st int16) error {
	switch st {
	case stApplied, stDeadLetter, stDropped, stRequeued:
		return nil
	case stBelowCursor:
		return ErrAlreadyAcked
	case stLeaseLost:
		return ErrLeaseLost
	case stUnknown:
		return ErrUnknownMessage
	default:
		return fmt.Errorf("queen: settle: unexpected status %d", st)
	}
}

func (m *Message) settleOne(ctx context.Context, op settleOp) error {
	if m == nil || m.q == nil {
		return ErrUnknownMessage
	}
	e := m.q.c.e
	st, err := e.settle(ctx, []settleOp{op})
	if err != nil {
		return err
	}
	e.countSettled(ctx, &op, st[0])
	err = statusErr(st[0])
	if err == nil {
		atomic.StoreInt32(&m.appSettled, 1)
	}
	return err
}

// countSettled counts what a settlement an application asked for applied
// (or the lease it found lost). op acks its message when it has no action.
func (e *engine) countSettled(ctx context.Context, op *settleOp, st int16) {
	d := op.m.meter()
	acks := 0
	if op.act == actNone && op.ok >= 0 {
		acks = 1
	}
	d.settledOp(ctx, op, acks, 1, st)
	if st == stLeaseLost {
		d.leaseLost(ctx)
	}
}

// MaxReasonLen is the longest reason (the text of the error passed to Fail
// or DeadLetter, or returned by a Consume handler) a dead letter keeps, in
// bytes; a longer one is cut at a character boundary.
const MaxReasonLen = 8 << 10

// storedReason is a reason made storable by reasonText, the only way to
// get one: every settlement's reason field has this type, so no path can
// hand the database an error's raw text.
type storedReason string

// reasonText makes err's text storable as PostgreSQL text: invalid UTF-8
// becomes U+FFFD, NUL bytes are dropped, and it is capped at MaxReasonLen.
// A reason the database rejected would fail the settlement every time (a
// message Consume redelivers forever) and every other settlement fused into
// the same statement.
func reasonText(err error) storedReason {
	if err == nil {
		return ""
	}
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > MaxReasonLen {
		cut := MaxReasonLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return storedReason(s)
}

// Ack marks the message done and commits its partition's cursor through it:
// earlier unacked messages of the same lease complete with it. The lease
// ends once its last message is acked. It returns ErrAlreadyAcked when the
// cursor is already past the message (nothing changed) and ErrLeaseLost when
// the lease expired or was taken over (the message may be redelivered).
//
// Ack returns once the database has committed (or refused) it. ctx does not
// cancel it, even when it commits alone on the calling goroutine (nothing
// else settling meanwhile): it runs to completion within
// Config.StatementTimeout. The same holds for Fail, Retry, DeadLetter and
// AckBatch.
//
// In a Consume handler with KeyConcurrency > 1, Ack settles the message
// alone (other keys' earlier messages may still be running), and so does
// DeadLetter; Fail and Retry return an error there: the handler's own error
// is how a message fails, so that its key pauses.
func (m *Message) Ack(ctx context.Context) error {
	if m == nil {
		return ErrUnknownMessage // m.Offset below would panic
	}
	if m.keyed {
		return m.settleKeyedOne(actNone, "")
	}
	return m.settleOne(ctx, settleOp{m: m, ok: m.Offset, act: actNone})
}

// settleKeyedOne settles a per-key Consume's message alone, out of order.
func (m *Message) settleKeyedOne(act int16, reason storedReason) error {
	if m.q == nil {
		return ErrUnknownMessage
	}
	e := m.q.c.e
	if e.isClosed() {
		return ErrClosed
	}
	rows := []keyedRow{{m: m, act: act, reason: reason}}
	sts, err := e.settleKeyedFused(settleOp{m: m, keyed: rows})
	if err != nil {
		return err
	}
	d := m.meter()
	d.settledRows(context.Background(), rows, sts)
	if sts[0] == stLeaseLost {
		d.leaseLost(context.Background())
	}
	return statusErr(sts[0])
}

// Fail reports a failed attempt. Earlier messages of the lease complete, the
// lease is released, and delivery resumes at this message, charging one
// attempt against the queue's RetryLimit, once the queue's RetryBackoff has
// passed (or the wait a RetryAfter reason asks for). The failure that spends
// the budget moves the message to the dead-letter store (if the queue keeps
// dead letters, else drops it) and the cursor past it. Errors are as for Ack.
func (m *Message) Fail(ctx context.Context, reason error) error {
	if m != nil && m.keyed {
		return ErrKeyedSettle
	}
	return m.settleOne(ctx, failOp(m, reason))
}

// RetryAfter is Fail with a wait of d before the next attempt instead of
// the queue's RetryBackoff (see the function RetryAfter for the bounds of
// d): for a Pop user told by a downstream when to come back. The failure
// is charged; the one that spends the budget dead-letters (or drops) the
// message at once. Errors are as for Ack.
func (m *Message) RetryAfter(ctx context.Context, d time.Duration) error {
	return m.Fail(ctx, RetryAfter(d, nil))
}

// Retry releases the lease so delivery resumes at this message at once,
// without charging the retry budget and without waiting out the queue's
// RetryBackoff (a wait is for failures; a handler that wants one returns
// or reports RetryAfter instead). Earlier messages of the lease complete.
// Errors are as for Ack.
func (m *Message) Retry(ctx context.Context) error {
	if m != nil && m.keyed {
		return ErrKeyedSettle
	}
	return m.settleOne(ctx, settleOp{m: m, ok: -1, act: actRetry, actMsg: m})
}

// DeadLetter moves the message to the dead-letter store at once (whatever
// the queue's DeadLetter setting) and commits the cursor through it; the
// rest of the lease stays owned. Errors are as for Ack.
func (m *Message) DeadLetter(ctx context.Context, reason error) error {
	if m != nil && m.keyed {
		return m.settleKeyedOne(actDeadLetter, reasonText(reason))
	}
	return m.settleOne(ctx, settleOp{m: m, ok: -1, act: actDeadLetter, actMsg: m, reason: reasonText(reason)})
}

// ExtendLease renews the message's lease (which covers its whole batch in
// this partition) to end d from now. It returns ErrLeaseLost when the lease
// already ended; d must be positive.
func (m *Message) ExtendLease(ctx context.Context, d time.Duration) error {
	if m == nil || m.q == nil {
		return ErrUnknownMessage
	}
	if d <= 0 {
		return fmt.Errorf("queen: ExtendLease: duration %s must be positive", d)
	}
	if m.lease == uuid.Nil {
		return ErrLeaseLost
	}
	exp, err := m.q.c.e.extend(ctx, m, d)
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			m.meter().leaseLost(ctx)
		}
		return err
	}
	m.LeaseExpiresAt = exp
	return nil
}

// extend renews m's lease without touching m, so a renewer can run beside
// a handler that reads the message.
func (e *engine) extend(ctx context.Context, m *Message, d time.Duration) (time.Time, error) {
	if e.isClosed() {
		return time.Time{}, ErrClosed
	}
	exp, err := stmt.Extend(ctx, e.csql, e.pool, m.leaseOf(), d, m.mem.leaseOwner(""))
	if err != nil {
		if isNoRows(err) {
			return exp, ErrLeaseLost
		}
		return exp, fmt.Errorf("queen: extend lease: %w", err)
	}
	m.mem.carry() // the renewal was the member's heartbeat
	return exp, nil
}

// AckBatch settles many messages in one transaction and returns one error
// per request, in input order (nil: applied). Requests are grouped by lease
// and taken in offset order; within a lease the cursor is committed through
// the last success before the first non-success, which is then applied (see
// Fail, Retry, DeadLetter), and the lease is released so every later request
// of that lease gets ErrAckSkipped and its message is redelivered. The
// second result is for the call as a whole. A message a Consume handler with
// KeyConcurrency > 1 is running gets an error: it settles by its handler's
// return (or Ack, DeadLetter).
func (q *Queue) AckBatch(ctx context.Context, reqs []AckRequest) ([]error, error) {
	e := q.c.e
	if e.isClosed() {
		return nil, ErrClosed
	}
	errs := make([]error, len(reqs))
	type leaseKey struct {
		pid   int64
		group string
		lease uuid.UUID
	}
	byLease := map[leaseKey][]int{}
	var order []leaseKey
	for i, r := range reqs {
		m := r.Message
		if m == nil || m.q == nil {
			errs[i] = ErrUnknownMessage
			continue
		}
		if m.keyed {
			errs[i] = ErrKeyedSettle
			continue
		}
		if r.Status < AckSuccess || r.Status > AckDeadLetter {
			errs[i] = fmt.Errorf("queen: AckBatch: request %d: unknown status %d", i, r.Status)
			continue
		}
		k := leaseKey{m.pid, m.Group, m.lease}
		if _, ok := byLease[k]; !ok {
			order = append(order, k)
		}
		byLease[k] = append(byLease[k], i)
	}
	var ops []settleOp
	var members [][]int // per op: the requests that take its verdict
	for _, k := range order {
		idx := byLease[k]
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(reqs[a].Message.Offset, reqs[b].Message.Offset) })
		op := settleOp{m: reqs[idx[0]].Message, ok: -1, act: actNone}
		var took []int
		for j, i := range idx {
			r := reqs[i]
			if r.Status == AckSuccess {
				op.ok = r.Message.Offset
				took = append(took, i)
				continue
			}
			op.actMsg, op.reason = r.Message, reasonText(r.Reason)
			switch r.Status {
			case AckFail:
				op.act, op.delay = actFail, retryDelay(r.Reason)
			case AckRetry:
				op.act = actRetry
			case AckDeadLetter:
				op.act = actDeadLetter
			}
			took = append(took, i)
			for _, s := range idx[j+1:] {
				errs[s] = ErrAckSkipped
			}
			op.release = j+1 < len(idx)
			break
		}
		ops = append(ops, op)
		members = append(members, took)
	}
	if len(ops) == 0 {
		return errs, nil
	}
	sts, err := e.settle(ctx, ops)
	if err != nil {
		return nil, err
	}
	for k, st := range sts {
		acks := 0
		for _, i := range members[k] {
			errs[i] = statusErr(st)
			if reqs[i].Status == AckSuccess {
				acks++
			}
		}
		d := ops[k].m.meter()
		d.settledOp(ctx, &ops[k], acks, 1, st)
		if st == stLeaseLost {
			d.leaseLost(ctx)
		}
	}
	return errs, nil
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
