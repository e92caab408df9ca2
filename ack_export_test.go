package queen

import (
	"context"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/fusion"
)

// SettleInOneFlush settles msgs in one ack-fusion flush, as if their
// consumers' calls had been fused: statuses[i] is AckSuccess (Ack), AckFail
// (Fail with reasons[i]), AckRetry or AckDeadLetter (with reasons[i]). It
// returns each message's verdict as the settling call would.
func SettleInOneFlush(c *Client, msgs []*Message, statuses []AckStatus, reasons []error) []error {
	items := make([]*ackItem, len(msgs))
	var bundle []*fusion.Batch[ackKey, *ackItem]
	for i, m := range msgs {
		op := settleOp{m: m, ok: m.Offset, act: actNone}
		switch statuses[i] {
		case AckFail:
			op = settleOp{m: m, ok: -1, act: actFail, actMsg: m, reason: reasonText(reasons[i])}
		case AckRetry:
			op = settleOp{m: m, ok: -1, act: actRetry, actMsg: m}
		case AckDeadLetter:
			op = settleOp{m: m, ok: -1, act: actDeadLetter, actMsg: m, reason: reasonText(reasons[i])}
		}
		items[i] = &ackItem{op: op}
		bundle = append(bundle, &fusion.Batch[ackKey, *ackItem]{Key: ackKeyOf(op), Items: []*ackItem{items[i]}})
	}
	_ = c.e.acks.flush(context.Background(), bundle)
	out := make([]error, len(items))
	for i, it := range items {
		out[i] = it.err
		if it.err == nil {
			out[i] = statusErr(it.st)
		}
	}
	return out
}

// RequeueSegment is the segment a skip-policy failure of a message with
// these stored fields appends (requeueSegment).
func RequeueSegment(id uuid.UUID, flags byte, txn, key string, hdrs, stored []byte) []byte {
	return requeueSegment(&Message{ID: id, TransactionID: txn, Key: key, flags: flags, hdrs: hdrs, stored: stored})
}
