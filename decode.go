package queen

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
)

// decodeRun turns the frames at offsets lo through hi of the segment that
// starts at base into messages: Pop and Peek read a segment the same way.
// newMsg makes the message for an offset with its delivery fields (nil skips
// the offset); decodeRun fills in what the frame stores: ID, TransactionID,
// Key, Headers and Data, opened on an encrypted queue. each receives every
// message with the error opening its payload gave (the message is then
// without Data); an error from each ends the run and is returned.
//
// What a message keeps of its frame is copied, not aliased, since frames
// may be a buffer the caller reuses: Data (the caller's to write to),
// TransactionID, Key and the header names and values, packed into a's
// chunks rather than allocated one by one (a may serve several runs: a.last estimates the messages to come).
//
// With snap, each message also keeps where its headers and payload as
// stored are (ciphertext when encrypted): what a dead letter or a re-enqueue
// writes back, which must not change when the caller writes to Data. No
// message keeps any part of frames, so the caller may reuse it.
//
// next is the offset of the first frame not turned into a message: when err
// wraps frame.ErrCorrupt (a frame that does not decode, a segment without a
// frame for an offset up to hi), the offsets from next through hi are
// undecodable.
func (q *Queue) decodeRun(a *decodeArena, pname string, frames []byte, base, end, lo, hi int64, snap *segSnap,
	newMsg func(off int64) *Message, each func(m *Message, openErr error) error) (next int64, err error) {
	next = lo
	err = frame.ViewRange(frames, int(lo-base), int(hi-base), func(k int, f *frame.View) error {
		off := base + int64(k)
		next = off
		m := newMsg(off)
		if m == nil {
			next = off + 1
			return nil
		}
		sealed := f.Flags&frame.FlagEncrypted != 0
		// Room for everything the message copies; its header names and
		// values take less than the encoded headers.
		size := len(f.TransactionID) + len(f.Key) + len(f.Headers)
		if !sealed {
			size += len(f.Payload)
		}
		a.start(size, off)
		m.ID, m.flags = f.ID, f.Flags
		if !sealed {
			m.Data = a.bytes(f.Payload)
		}
		m.TransactionID, m.Key = a.String(f.TransactionID), a.String(f.Key)
		if len(f.Headers) > 0 {
			h, err := frame.DecodeHeadersWith(f.Headers, a)
			if err != nil {
				return fmt.Errorf("%w: offset %d: headers: %v", frame.ErrCorrupt, off, err)
			}
			m.Headers = h
		}
		if snap != nil {
			m.snap, m.snapAt = snap, k
		}
		var openErr error
		if sealed {
			m.Data, openErr = q.c.e.keys.Open(q.c.tenant, q.name, pname, m.Key, f.Headers, f.ID, f.Payload)
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

// slabBytes is the most a decodeArena or msgSlab allocates at once for many
// small messages: the largest size class of Go's allocator, so a chunk
// comes from the per-P cache, not the heap's lock, and a message kept past
// its batch keeps at most this much of the others alive.
const slabBytes = 32 << 10

// decodeArena hands out the bytes the messages of a claim (or a peek) keep
// of their frames, in chunks of up to slabBytes sized for the messages still
// to come: 1000 messages of 200 bytes make eight allocations, not 2000. It
// never hands out a byte twice and never writes to one it handed out, so the
// strings made over its bytes stay immutable, and each piece's capacity ends
// with it, so appending to a message's Data never writes into another's.
type decodeArena struct {
	free []byte
	msg  []byte // the rest of the current message's reservation
	// last is the last offset the claim takes: off..last are still to come.
	last int64
}

// start reserves size bytes for the message at offset off, to be handed
// out by bytes and String; it starts a chunk sized for the messages to
// come, of about that size, if need be.
func (a *decodeArena) start(size int, off int64) {
	if size > len(a.free) {
		n := size
		if size < slabBytes {
			left := min(max(a.last-off+1, 1), slabBytes)
			n = int(min(int64(size)*left, slabBytes))
		}
		a.free = make([]byte, n)
	}
	a.msg = a.free[:size:size]
	a.free = a.free[size:]
}

// bytes returns a copy of p from the message's reservation, its capacity
// its length; never nil, as a payload of its own would not be.
func (a *decodeArena) bytes(p []byte) []byte {
	if len(p) == 0 {
		return []byte{}
	}
	n := copy(a.msg, p)
	b := a.msg[:n:n]
	a.msg = a.msg[n:]
	return b
}

// String returns a copy of p from the message's reservation as a string
// (frame.Strings): it aliases bytes never written again.
func (a *decodeArena) String(p []byte) string {
	if len(p) == 0 {
		return ""
	}
	b := a.bytes(p)
	return unsafe.String(&b[0], len(b))
}

// msgSlab hands out the Messages of a claim from chunks of up to slabBytes
// rather than one allocation each.
type msgSlab struct{ free []Message }

// slabMsgs is how many Messages a chunk of msgSlab holds at most.
const slabMsgs = slabBytes / int64(unsafe.Sizeof(Message{}))

// take returns a zero Message, starting a chunk for left of them (this
// one included) if need be.
func (s *msgSlab) take(left int64) *Message {
	if len(s.free) == 0 {
		s.free = make([]Message, min(max(left, 1), slabMsgs))
	}
	m := &s.free[0]
	s.free = s.free[1:]
	return m
}

// segSnap is the segment a pop's messages were decoded from, for the rare
// message whose frame must be written back exactly as stored (a failure the
// skip policy re-enqueues, a dead letter). Rather than a copy of every
// message's stored headers and payload, the messages share the stored blob
// and decompress it again once one needs it, so the buffer they were
// decoded from is reused at once.
type segSnap struct {
	blob   []byte // as stored; nil when frames was known from the start
	once   sync.Once
	frames []byte
	err    error
}

// frame returns the k-th frame of the segment as stored; its headers and
// payload alias the segment, which nothing writes to.
func (s *segSnap) frame(k int) (frame.Frame, error) {
	s.once.Do(func() {
		if s.frames == nil {
			s.frames, s.err = segment.Decompress(nil, s.blob)
		}
	})
	if s.err != nil {
		return frame.Frame{}, s.err
	}
	return frame.At(s.frames, k)
}

// frameBufs holds buffers a pop decompresses a segment into when nothing
// keeps the result (see segCache.frames): a drain would otherwise allocate
// (and clear) a segment's size per batch. Of *[]byte.
var frameBufs sync.Pool

// maxPooledFrames is the largest buffer frameBufs keeps: a segment of
// unusual size is not held for the next pop.
const maxPooledFrames = 4 << 20
