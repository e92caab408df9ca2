package stmt

// Consume is the consumption side's statements, rendered for one schema.
type Consume struct {
	// Pop claims and leases (see Pop): one row per delivered segment.
	Pop string
	// PopAhead claims ahead under a held lease (see PopAhead).
	PopAhead string
	// PopLinger claims under a lingering lease, LingerAck acks a batch
	// keeping its lease (see PopLinger, LingerAck).
	PopLinger string
	LingerAck string
	// PushTake is PopLinger in a push's own transaction (see PushTake).
	PushTake string
	// SegmentBlob reads one segment's blob (see SegmentBlob).
	SegmentBlob string
	// PopDeadLetter dead-letters messages a pop claimed but cannot decode
	// (see PopDeadLetter).
	PopDeadLetter string
	// Settle applies acks, failures, retries and dead letters (see Settle
	// and settle_v2() in sqlschema/functions/settle.sql).
	Settle string
	// SettleKeyed applies out-of-order settlements of per-key parallel
	// Consume (see SettleKeyed and settle_keyed_v2() in
	// sqlschema/functions/settle.sql).
	SettleKeyed string
	// AckMany commits pure acks set-based (see AckMany).
	AckMany string
	// Extend renews a live lease (see Extend).
	Extend string
	// Status lists every partition of a queue with each group's cursor
	// and lease (see Status).
	Status string
	// StatusRouted is Status on the Citus layout (see Status).
	StatusRouted string
	// DeadLetters pages a queue's dead letters by id (see DeadLetters).
	DeadLetters string
	// Peek reads segments without a lease or a cursor (see Peek).
	Peek string
	// Pause pauses a group, creating the queue if missing; Resume deletes
	// the pause (see Pause, Resume).
	Pause  string
	Resume string
	// RequeueCandidates pages dead letters like DeadLetters with what
	// their re-enqueue segments need (see RequeueCandidates).
	RequeueCandidates string
	// QueueIDEnc reads a queue's id and encryption flag (see QueueIDEnc).
	QueueIDEnc string
	// Requeue requeues dead letters (see Requeue and
	// requeue_dead_letters_v2() in sqlschema/functions/deadletter.sql).
	Requeue string
	// Queues lists every queue of a tenant with its options and counts,
	// one row per group (see Queues).
	Queues string
	// QueuesRouted is Queues on the Citus layout (see Queues).
	QueuesRouted string
	// DiscardDeadLetters deletes a page of dead letters (see
	// DiscardDeadLetters).
	DiscardDeadLetters string
	// ResetGroup moves a group's cursors, DeleteGroup deletes a group,
	// ReleaseLease ends a lease (see the functions of the same names).
	ResetGroup   string
	DeleteGroup  string
	ReleaseLease string
	// MemberBeat, MemberLeave and Members write, delete and list consumer
	// group members (see the functions of the same names).
	MemberBeat  string
	MemberLeave string
	Members     string
}

// Settle actions, the Act of SettleParams and SettleKeyedParams, as
// sqlschema/functions/settle.sql numbers them.
const (
	ActNone       int16 = 0 // an ack
	ActFail       int16 = 1 // charge a failure (retry limit, failure policy)
	ActRetry      int16 = 2 // redeliver in place, uncharged
	ActDeadLetter int16 = 3 // dead-letter the message
	ActInterrupt  int16 = 4 // a retry that also takes back the lease's delivery
	ActCarry      int16 = 5 // SettleKeyed only: no outcome, only the lease's release
	ActPark       int16 = 6 // SettleKeyed only: a carry left with waiting keys only
	ActHeld       int16 = 7 // SettleKeyed only: left unstarted behind a waiting message of its key
)

// Settle statuses, the status column of Settle, SettleKeyed and AckMany, as
// sqlschema/functions/settle.sql numbers them.
const (
	SettleApplied      int16 = 0 // the cursor moved (or the failure was charged)
	SettleBelowCursor  int16 = 1 // already settled; nothing changed
	SettleLeaseLost    int16 = 2 // the lease is not the cursor's live one
	SettleDeadLettered int16 = 3 // applied; the message went to the dead letters
	SettleDropped      int16 = 4 // applied; the exhausted message was dropped
	SettleUnknown      int16 = 5 // no such cursor
	SettleRequeued     int16 = 6 // SettleKeyed only: applied, the failure re-enqueued at the tail
)

// NewConsume renders the consumption statements for schema, which must
// already be validated.
func NewConsume(schema string) *Consume {
	c := &Consume{}
	current().fill(c, schema)
	return c
}
