package stmt

// Consume is the consumption side's statements, rendered for one schema.
type Consume struct {
	// Pop claims and leases (see Pop): one row per delivered segment.
	Pop string
	// PopDeadLetter dead-letters messages a pop claimed but cannot decode
	// (see PopDeadLetter).
	PopDeadLetter string
	// Settle applies acks, failures, retries and dead letters, one result
	// per input in input order; $16 holds each failure's re-enqueue segment
	// (NULL for other actions). See settle_v2() in
	// sqlschema/functions/settle.sql.
	Settle string
	// SettleKeyed applies out-of-order settlements of per-key parallel
	// Consume, one row per message outcome: $1 partition ids, $2 groups, $3
	// leases, $4 offsets, $5 actions, $6 release, $7 reasons, then the
	// dead-letter snapshot $8 ids, $9 transaction ids, $10 flags, $11
	// payloads, $12 created at, $13 keys, $14 headers, and $15 each
	// failure's re-enqueue segment (NULL for other actions). One result per
	// row, in row order; see settle_keyed_v2() in
	// sqlschema/functions/settle.sql.
	SettleKeyed string
	// AckMany commits pure acks set-based: $1 partition ids, $2 groups,
	// $3 leases, $4 offsets; at most one per (partition, group).
	AckMany string
	// Extend renews a live lease (see Extend).
	Extend string
	// Status lists every partition of ($1 tenant, $2 queue) with each
	// group's cursor and lease and whether the group is paused; a partition
	// without groups has NULL group columns.
	Status string
	// DeadLetters pages the dead letters of ($1 tenant, $2 queue) by id:
	// $3 groups (NULL = all), $4 partition (NULL = all), $5 since, $6
	// until, $7 after id, $8 limit, $9 ids (NULL = all), $10 the highest
	// id (NULL = none). $10 trims the function's page, which is in id
	// order: the rows it drops come after every row it keeps.
	DeadLetters string
	// Peek reads segments without a lease or a cursor: ($1 tenant, $2
	// queue), $3 partition (NULL = all), $4 the first offset, $5 the most
	// messages. One row per segment holding offsets at or after $4, by
	// partition name (byte order) then offset, until $5 messages are
	// covered.
	Peek string
	// Pause pauses ($1 tenant, $2 queue, $3 group), creating the queue if
	// missing; Resume deletes the pause and returns a row if there was one.
	Pause  string
	Resume string
	// RequeueCandidates pages dead letters like DeadLetters ($1..$8, $10
	// ids, $11 the highest id) for a
	// requeue: id, transaction id, whether it needs sealing (($9) the queue
	// is encrypted and the dead letter is not), stored payload, partition,
	// message id, key, headers and flags: what its re-enqueue segment
	// needs.
	RequeueCandidates string
	// QueueIDEnc reads ($1 tenant, $2 name)'s id and encryption flag.
	QueueIDEnc string
	// Requeue requeues dead letters: $1 queue id, $2 ids, $3 hashes, $4
	// replacement payloads and $5 replacement flags (of a dead letter the
	// client sealed; NULL otherwise), $6 the segments their copies append;
	// see requeue_dead_letters_v2() in sqlschema/functions/deadletter.sql.
	Requeue string
	// Queues lists every queue of tenant $1 with its options, partition
	// count, depth and oldest unconsumed message, one row per group (NULL
	// group columns for a queue without groups), ordered by queue and group.
	Queues string
}

// Settle actions, the $5 of Settle and SettleKeyed per input, as
// sqlschema/functions/settle.sql numbers them.
const (
	ActNone       int16 = 0 // an ack
	ActFail       int16 = 1 // charge a failure (retry limit, failure policy)
	ActRetry      int16 = 2 // redeliver in place, uncharged
	ActDeadLetter int16 = 3 // dead-letter the message
	ActInterrupt  int16 = 4 // a retry that also takes back the lease's delivery
	ActCarry      int16 = 5 // SettleKeyed only: no outcome, only the lease's release
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
