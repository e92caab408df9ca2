package queen

import (
	"context"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/settle"
)

// SettleInOneFlush settles msgs in one ack-fusion flush, as if their
// consumers' calls had been fused: statuses[i] is AckSuccess (Ack), AckFail
// (Fail with reasons[i]), AckRetry or AckDeadLetter (with reasons[i]). It
// returns each message's verdict as the settling call would.
func SettleInOneFlush(c *Client, msgs []*Message, statuses []AckStatus, reasons []error) []error {
	ops := make([]settleOp, len(msgs))
	for i, m := range msgs {
		ops[i] = settleOp{m: m, ok: m.Offset, act: actNone}
		switch statuses[i] {
		case AckFail:
			ops[i] = settleOp{m: m, ok: -1, act: actFail, actMsg: m, reason: reasonText(reasons[i])}
		case AckRetry:
			ops[i] = settleOp{m: m, ok: -1, act: actRetry, actMsg: m}
		case AckDeadLetter:
			ops[i] = settleOp{m: m, ok: -1, act: actDeadLetter, actMsg: m, reason: reasonText(reasons[i])}
		}
	}
	res, _ := settle.Apply(context.Background(), c.e.csql, c.e.pool, settleParams(ops))
	out := make([]error, len(res))
	for i, r := range res {
		out[i] = r.Err
		if r.Err == nil {
			out[i] = statusErr(r.Status)
		}
	}
	return out
}

// RequeueSegment is the segment a skip-policy failure of a message with
// these stored fields appends (segment.Single).
func RequeueSegment(id uuid.UUID, flags byte, txn, key string, hdrs, stored []byte) []byte {
	return segment.Single(&frame.Frame{ID: id, Flags: flags, TransactionID: txn, Key: key, Headers: hdrs, Payload: stored})
}

// AckInline is the number of settle flushes c's ack engine ran on the
// settling goroutine.
func AckInline(c *Client) uint64 { return c.e.acks.Stats().Inline }
