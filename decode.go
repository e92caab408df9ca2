package queen

import (
	"fmt"
	"slices"

	"github.com/e03140bc/queen/internal/frame"
)

// decodeRun turns the frames at offsets lo through hi of the segment that
// starts at base into messages: Pop and Peek read a segment the same way.
// newMsg makes the message for an offset with its delivery fields (nil skips
// the offset); decodeRun fills in what the frame stores: ID, TransactionID,
// Key, Headers and Data, opened on an encrypted queue. each receives every
// message with the error opening its payload gave (the message is then
// without Data); an error from each ends the run and is returned.
//
// With snapshot, each message also keeps its headers and payload as stored
// (ciphertext when encrypted): the copy a dead letter or a re-enqueue takes,
// which must not change when the caller writes to Data.
//
// next is the offset of the first frame not turned into a message: when err
// wraps frame.ErrCorrupt (a frame that does not decode, a segment without a
// frame for an offset up to hi), the offsets from next through hi are
// undecodable.
func (q *Queue) decodeRun(pname string, frames []byte, base, end, lo, hi int64, snapshot bool,
	newMsg func(off int64) *Message, each func(m *Message, openErr error) error) (next int64, err error) {
	next = lo
	err = frame.DecodeRange(frames, int(lo-base), int(hi-base), func(k int, f *frame.Frame) error {
		off := base + int64(k)
		next = off
		m := newMsg(off)
		if m == nil {
			next = off + 1
			return nil
		}
		m.ID, m.TransactionID, m.Key, m.flags = f.ID, f.TransactionID, f.Key, f.Flags
		if len(f.Headers) > 0 {
			// f.Headers aliases the segment, which may be cached or reused.
			hdrs := slices.Clone(f.Headers)
			h, err := frame.DecodeHeaders(hdrs)
			if err != nil {
				return fmt.Errorf("%w: offset %d: headers: %v", frame.ErrCorrupt, off, err)
			}
			m.Headers = h
			if snapshot {
				m.hdrs = hdrs
			}
		}
		var openErr error
		if f.Flags&frame.FlagEncrypted != 0 {
			if snapshot {
				m.stored = slices.Clone(f.Payload)
			}
			m.Data, openErr = q.c.e.keys.Open(q.c.tenant, q.name, pname, f.Key, f.Headers, f.ID, f.Payload)
		} else {
			// Data is the caller's to write to; one allocation for it and
			// the snapshot.
			n := len(f.Payload)
			w := n
			if snapshot {
				w = 2 * n
			}
			buf := make([]byte, w)
			copy(buf, f.Payload)
			m.Data = buf[:n:n]
			if snapshot {
				copy(buf[n:], f.Payload)
				m.stored = buf[n:]
			}
		}
		if err := each(m, openErr); err != nil {
			return err
		}
		next = off + 1
		return nil
	})
	if err == nil && next <= hi {
		err = fmt.Errorf("%w: segment %d-%d has no frame for offset %d", frame.ErrCorrupt, base, end, next)
	}
	return next, err
}
