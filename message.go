package queen

import (
	"encoding/binary"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/internal/msg"
)

// idMinter mints the message ids of one push call. The first is
// uuid.NewV7; each next one counts up the 62 random bits of the one before
// (RFC 9562 section 6.2, method 2), so a 1000-item call takes the
// generator's lock and reads the random source once rather than 1000 times.
// The ids still sort in item order and stay unique: they share the first
// one's timestamp and counter, which the generator never hands out again.
type idMinter struct {
	last uuid.UUID
	rand uint64 // the random bits of last
	ok   bool
}

// randBits is the mask of the random bits of a V7 id's last eight bytes;
// the top two hold the variant.
const randBits = 1<<62 - 1

func (m *idMinter) next() (uuid.UUID, error) {
	if m.ok && m.rand < randBits {
		m.rand++
		binary.BigEndian.PutUint64(m.last[8:], m.rand|1<<63) // variant 10
		return m.last, nil
	}
	// The first id, or the random bits ran out: a fresh one.
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.Nil, err
	}
	m.last, m.rand, m.ok = id, binary.BigEndian.Uint64(id[8:])&randBits, true
	return id, nil
}

// idTexts hands out minted ids' canonical text (uuid.UUID.String, the
// transaction id of an item without one) from shared chunks: a call of
// 1000 such items allocated 1000 strings. A chunk holds at most
// idTextChunk texts, so one result kept alive pins little. A text's bytes
// are never written again: later ones go past the end of the chunk.
type idTexts struct {
	b strings.Builder
}

const (
	idTextLen   = 36
	idTextChunk = 64
)

// text is id's canonical text; left is how many texts the call may still
// ask for, this one included, which sizes a new chunk.
func (t *idTexts) text(id uuid.UUID, left int) string {
	if t.b.Cap()-t.b.Len() < idTextLen {
		t.b = strings.Builder{}
		t.b.Grow(idTextLen * min(max(left, 1), idTextChunk))
	}
	const hex = "0123456789abcdef"
	var buf [idTextLen]byte
	j := 0
	for i, c := range id {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			buf[j] = '-'
			j++
		}
		buf[j], buf[j+1] = hex[c>>4], hex[c&0xf]
		j += 2
	}
	t.b.Write(buf[:])
	s := t.b.String()
	return s[len(s)-idTextLen:]
}

// Subscription is where a consumer group starts reading a queue on its first
// contact. It is stored durably per (queue, group), so partitions created
// later are seeded by the same choice, and it is ignored on every later pop.
// The zero value is SubscribeAll. Queue mode (Group "") always starts at the
// oldest retained message.
type Subscription = msg.Subscription

var (
	// SubscribeAll starts a new consumer group at the oldest retained
	// message of every partition.
	SubscribeAll = msg.SubscribeAll
	// SubscribeNew starts a new consumer group after the current tail of
	// every existing partition. Partitions created after the group's first
	// contact are read from their start.
	SubscribeNew = msg.SubscribeNew
)

// SubscribeFrom starts a new consumer group at the first message pushed at
// or after t (at segment granularity: messages committed together share a
// timestamp). Partitions created after the group's first contact are read
// from their start.
func SubscribeFrom(t time.Time) Subscription { return msg.SubscribeFrom(t) }

// PopOptions are the options of one Pop.
type PopOptions struct {
	// Group is the consumer group. Defaults to "": queue mode, where
	// competing consumers share one cursor per partition. Named groups each
	// get their own cursors (fan-out).
	Group string
	// Partition restricts the pop to one partition. Defaults to "": any
	// partition with messages.
	Partition string
	// Batch is the most messages one pop returns, across all its
	// partitions. Defaults to 1.
	Batch int
	// Partitions is the most partitions one pop takes messages from; each
	// gets its own lease. In Consume it is instead how many partitions'
	// batches each worker may hold, claimed ahead (see Queue.Consume).
	// Defaults to 1.
	Partitions int
	// Wait long-polls up to this long when nothing is available, without
	// holding a database connection. Defaults to 0: return at once.
	Wait time.Duration
	// AutoAck commits the cursor in the claim itself: no lease, nothing to
	// ack, and a message is never redelivered. Defaults to false.
	AutoAck bool
	// LeaseTime overrides the queue's LeaseTime for this pop; under 1ms it
	// is rounded up to 1ms (leases are kept in milliseconds). Defaults to 0:
	// the queue's (5 minutes unless configured).
	LeaseTime time.Duration
	// Subscription applies on the group's first contact only. Defaults to
	// SubscribeAll.
	Subscription Subscription
	// Member makes the caller a member of Group, by this id, for as long
	// as it keeps popping (see Member): each pop is its heartbeat, the
	// first one creates its row, and the leases it takes carry the id, so
	// Status can tell a lease whose holder stopped (LeaseHolderGone). Pass
	// the same id on every pop of one worker; Queue.LeaveGroup removes it,
	// or it expires MemberTTL after its last pop. At most 128 bytes of
	// UTF-8. Defaults to "": not a member. Consume ignores it: each Consume
	// call is a member by an id of its own.
	Member string

	mem *member // the member claiming: set by Pop from Member, by Consume for its own
	// keyed claims for a per-key Consume (KeyConcurrency > 1, not
	// AutoAck): the claim may carry messages whose retry wait holds
	// (Message.waiting), which such a batch does not start.
	keyed bool
}

// Message is one delivered message. Its methods settle it; a message from an
// AutoAck pop is already settled.
type Message struct {
	ID            uuid.UUID
	TransactionID string
	Queue         string
	Partition     string
	// Key is the ordering key the message was pushed with (Item.Key); ""
	// for none.
	Key string
	// Headers are the headers the message was pushed with (Item.Headers);
	// nil for none.
	Headers map[string]string
	Offset  int64
	// Data is the payload (the plaintext, also for encrypted queues). It is
	// the caller's own copy: writing to it changes nothing else (not the
	// dead-letter snapshot, a re-enqueued copy, or another pop's message).
	Data      []byte
	CreatedAt time.Time
	Group     string
	LeaseID   string // "" for AutoAck
	// Attempt is 1 on first delivery. On a redelivery it counts the leases
	// that started at this partition's cursor since the cursor last moved.
	Attempt int
	// LeaseExpiresAt is when the lease ends unless renewed; zero for AutoAck.
	LeaseExpiresAt time.Time

	q        *Queue
	pid      int64
	lease    uuid.UUID
	leaseDur time.Duration
	mem      *member // the group member that claimed it; nil for none
	flags    byte
	// snap is the segment m was popped from and snapAt m's frame in it:
	// its headers and payload as stored (ciphertext when encrypted), which a
	// dead letter and a re-enqueue keep. nil: none (undecodable).
	snap   *segSnap
	snapAt int
	// keyed marks a message a per-key parallel Consume handles: its own
	// settlement is per offset (settle_keyed), never through the lease.
	keyed bool
	// waiting marks a message of a keyed claim whose retry wait still
	// held at the claim: its batch starts neither it nor its key's later
	// messages.
	waiting bool
	// appSettled is set (atomically) once an Ack, Fail, Retry or
	// DeadLetter of the application applied: Consume's batch settlement
	// then does not count the message again.
	appSettled int32
	// dm is the consume-side instruments of (queue, group), looked up once
	// per claim so a settlement takes no lock to count.
	dm *destMeter
}

// meter returns the message's consume-side instruments.
func (m *Message) meter() *destMeter {
	if m.dm != nil {
		return m.dm
	}
	return m.q.c.e.meter.consume.dest(m.q.name, m.Group)
}
