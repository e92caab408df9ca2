// Package stmt holds queen's SQL statements: the text in this directory's
// *.sql files (one "-- name: Field" block per statement, {{schema}} for the
// schema), each filling a field of Set or Consume. Each statement has a
// function of the field's name that runs it: a params struct in, typed rows
// out, so callers pass no positional arguments and scan no columns. The
// push statements' functions (PushBundle, PushSegment, AppendSegment,
// SegmentAt) take package alloc's Bundle and answer its Verdicts: alloc
// binds the segments' reused arrays and scans the rows. A
// previous release's statements (see Use) name fewer parameters and
// columns; the functions here absorb that (prefixArgs, scanPrefix), so
// callers see one shape. The functions the statements call live in
// sqlschema's function layer. Statements are rendered once per schema and
// then used as constants, so pgx caches their prepared forms per
// connection.
package stmt

import (
	"fmt"

	"github.com/zeebo/xxh3"
)

// Set is every statement, rendered for one schema.
type Set struct {
	Schema string

	// PushBundle commits one bundle of segments: $1 queues, $2 partitions,
	// $3 counts, $4 hash blobs, $5 verified watermarks, $6 payload blobs,
	// $7 tenants, $8 flags, $9 every partition known to exist, $10 the lane
	// count each segment's keyed messages were routed with (0: none).
	PushBundle string
	// PushSegment commits one segment to a partition known to exist: $1
	// tenant, $2 queue, $3 partition, $4 count, $5 hash blob, $6 payload
	// blob, $7 flags, $8 lane count. One row, PushBundle's columns.
	PushSegment string
	// AppendSegment commits one segment to a partition known to exist of a
	// queue without a dedup window, in one statement: PushSegment's
	// parameters, then $9 the partition's id, and its columns, and no row
	// when it did not apply (no partition of that queue and name has the
	// id, the queue has a dedup window, is encrypted and the segment is
	// not, has another lane count, or is not keyed yet and the segment is
	// keyed). Then nothing was written.
	AppendSegment string
	// MarkKeyed marks queues keyed ahead of a push in a caller's
	// transaction (see MarkKeyed).
	MarkKeyed string
	// SegmentAt returns the segment covering ($1 partition id, $2 offset).
	SegmentAt string
	// QueueMeta reads the options of a queue the push path needs (see
	// QueueMeta).
	QueueMeta string
	// QueueUpsert creates or updates a queue's options (see QueueUpsert).
	QueueUpsert string
	// QueueDelete deletes a queue with its partitions' data (see
	// QueueDelete).
	QueueDelete string
	// Schedule holds items until due; MoveScheduled moves due ones into
	// their partitions; CancelScheduled deletes scheduled ones;
	// ScheduledStatus counts a queue's (see the functions of the same
	// names).
	Schedule        string
	MoveScheduled   string
	CancelScheduled string
	ScheduledStatus string
	// Notify wakes other processes (see Notify).
	Notify string
	// NotifyAlone is Notify as a transaction of its own that does not wait
	// for its commit record to be flushed (see NotifyAlone).
	NotifyAlone string
	// Channel is the LISTEN/NOTIFY channel name for this schema.
	Channel string

	// The maintenance pass's statements (see the functions of the same
	// names).
	MaintenanceWindow string
	MaintenanceDue    string
	RetentionStep     string
	PurgeTxnsStep     string
	PurgePartition    string
	LagByGroup        string
	// LagByGroupRouted is LagByGroup on the Citus layout (see LagByGroup).
	LagByGroupRouted string
	// DeadLetterRetentionStep deletes expired dead letters (see
	// DeadLetterRetentionStep).
	DeadLetterRetentionStep string
	// DeadLetterCounts counts each queue's dead letters (see
	// DeadLetterCounts).
	DeadLetterCounts string
	// ExpireMembers deletes the rows of crashed members (see
	// ExpireMembers).
	ExpireMembers string
	// TakeSamples writes the console's samples ring and Samples reads a
	// queue's (see TakeSamples, Samples).
	TakeSamples string
	Samples     string
	// GetMaintenance and SetMaintenance read and write the schema-wide
	// maintenance flag (see GetMaintenance, SetMaintenance).
	GetMaintenance string
	SetMaintenance string
	// MaintenanceLockKey is the advisory lock that elects one maintainer.
	MaintenanceLockKey int64
}

// New renders the statements for schema, which must already be validated.
func New(schema string) *Set {
	s := &Set{Schema: schema, Channel: channel(schema)}
	current().fill(s, schema)
	s.MaintenanceLockKey = int64(xxh3.HashString("queen:maintenance:" + schema))
	return s
}

// maxIdentifier is PostgreSQL's identifier limit (NAMEDATALEN - 1): LISTEN
// truncates a longer channel name and pg_notify rejects it.
const maxIdentifier = 63

// channel names the schema's LISTEN/NOTIFY channel: "queen_<schema>", or,
// when that is too long, a prefix of the schema and a hash of all of it.
// A hash collision only costs spurious wakes (a rescan), never a lost one.
func channel(schema string) string {
	if c := "queen_" + schema; len(c) <= maxIdentifier {
		return c
	}
	// 6 + 40 + 1 + 16 = 63 bytes; schema names are ASCII.
	return fmt.Sprintf("queen_%s_%016x", schema[:40], xxh3.HashString(schema))
}
