package queen

import (
	"context"
	"slices"
	"time"

	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/settle"
	"github.com/e03140bc/queen/internal/stmt"
)

// leaseOf is the lease m was delivered under.
func (m *Message) leaseOf() stmt.Lease {
	return stmt.Lease{Partition: m.pid, Group: m.Group, ID: m.lease}
}

// kept is m as a failure or a dead letter keeps it (nil for other actions):
// the frame exactly as stored, ciphertext included.
func (m *Message) kept(act int16) *stmt.Kept {
	if act != actFail && act != actDeadLetter {
		return nil
	}
	k := &stmt.Kept{
		Frame:     frame.Frame{ID: m.ID, Flags: m.flags, TransactionID: m.TransactionID, Key: m.Key},
		CreatedAt: m.CreatedAt,
	}
	if m.snap != nil {
		// It decoded from these very bytes, so this decodes too.
		if f, err := m.snap.frame(m.snapAt); err == nil {
			k.Frame.Headers, k.Frame.Payload = f.Headers, f.Payload
		}
	}
	return k
}

// params is op as package settle takes it.
func (op *settleOp) params() settle.Op {
	l := op.m.leaseOf()
	if op.keyed != nil {
		rows := make([]stmt.SettleKeyedParams, len(op.keyed))
		for i, r := range op.keyed {
			rows[i] = stmt.SettleKeyedParams{Lease: l, Offset: -1, Act: r.act, Release: op.release, Reason: string(r.reason),
				RetryAfter: r.delay}
			if r.m != nil {
				rows[i].Offset, rows[i].Kept = r.m.Offset, r.m.kept(r.act)
			}
		}
		return settle.Op{Keyed: rows}
	}
	p := stmt.SettleParams{Lease: l, Through: op.ok, Act: op.act, At: -1, Release: op.release, Reason: string(op.reason),
		RetryAfter: op.delay}
	if a := op.actMsg; a != nil {
		p.At, p.Kept = a.Offset, a.kept(op.act)
	}
	return settle.Op{Settle: p}
}

func settleParams(ops []settleOp) []settle.Op {
	out := make([]settle.Op, len(ops))
	for i := range ops {
		out[i] = ops[i].params()
	}
	return out
}

// settle applies ops through the ack fusion engine and returns each op's
// status. It returns when every op has been committed (or failed); see
// settle.Fusion.Settle.
func (e *engine) settle(ctx context.Context, ops []settleOp) ([]int16, error) {
	if e.isClosed() {
		return nil, ErrClosed
	}
	return e.settleFused(ctx, ops)
}

// settleFused is settle without the closed check, for Consume calls that
// Close stops before it closes the ack engine.
func (e *engine) settleFused(ctx context.Context, ops []settleOp) ([]int16, error) {
	res, err := e.acks.Settle(ctx, settleParams(ops))
	if err != nil {
		return nil, err
	}
	out := make([]int16, len(ops))
	retried := false
	for i, r := range res {
		if r.Err != nil {
			return nil, r.Err
		}
		out[i] = r.Status
		if ops[i].act == actFail && r.Status == stApplied {
			retried = true
		}
	}
	if retried {
		e.noteRetries()
	}
	return out, nil
}

// noteRetries has the mover look at once after a charged failure: under
// the skip policy with a wait, its copy waits in the scheduled table (see
// DESIGN.md, "Retry backoff"), and the move's answer tells the mover when
// it is due. Without it the mover would find the copy only at its poll.
func (e *engine) noteRetries() {
	e.mover.note(time.Now())
}

// settleKeyedFused applies one out-of-order settlement through the ack
// fusion engine and returns its row statuses.
func (e *engine) settleKeyedFused(op settleOp) ([]int16, error) {
	res, err := e.acks.Settle(context.Background(), []settle.Op{op.params()})
	if err != nil {
		return nil, err
	}
	if res[0].Err != nil {
		return nil, res[0].Err
	}
	if slices.Contains(res[0].Statuses, stRequeued) {
		e.noteRetries()
	}
	return res[0].Statuses, nil
}
