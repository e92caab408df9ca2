package queen

import (
	"context"
	"fmt"
	"time"
)

// MaintenanceConfig tunes the background maintenance loop. One process at a
// time runs it per schema (an advisory lock elects it); every pass works in
// bounded steps, each holding one partition row briefly, so it never blocks
// pushes or pops for longer than one step.
type MaintenanceConfig struct {
	// Interval between passes. Defaults to DefaultMaintenanceInterval (1s). Negative disables the loop
	// (Client.Maintain still runs a pass on demand).
	Interval time.Duration
	// IdlePartition is how long an empty partition must go unwritten before
	// it is forgotten (its offsets restart at 0 if it is pushed to again).
	// Defaults to DefaultIdlePartition (24h). Negative keeps partitions forever.
	IdlePartition time.Duration
	// HashFloor is the least time hash rows are kept, whatever the queue's
	// DedupWindow: acks by transaction id resolve through them. Defaults to
	// DefaultHashFloor, 10 minutes (and never less than the queue's
	// LeaseTime).
	HashFloor time.Duration
	// StepPartitions is how many partitions (in id order, resuming where
	// the last pass stopped) one pass looks at. Defaults to DefaultStepPartitions (256).
	StepPartitions int
	// StepRows bounds the segments or hash rows one step deletes from one
	// partition, and the dead letters past their queue's
	// DeadLetterRetention one pass deletes. Defaults to DefaultStepRows
	// (1000).
	StepRows int
}

func (m MaintenanceConfig) withDefaults() MaintenanceConfig {
	if m.Interval == 0 {
		m.Interval = DefaultMaintenanceInterval
	}
	if m.IdlePartition == 0 {
		m.IdlePartition = DefaultIdlePartition
	}
	if m.HashFloor <= 0 {
		m.HashFloor = DefaultHashFloor
	}
	if m.StepPartitions <= 0 {
		m.StepPartitions = DefaultStepPartitions
	}
	if m.StepRows <= 0 {
		m.StepRows = DefaultStepRows
	}
	return m
}

// MaintenanceReport says what one pass did.
type MaintenanceReport struct {
	Ran               bool // false: another process holds the maintenance lock
	SegmentsDeleted   int
	HashRowsDeleted   int
	PartitionsPurged  int
	PartitionsVisited int
	// DeadLettersDeleted is how many dead letters past their queue's
	// DeadLetterRetention the pass deleted (at most StepRows).
	DeadLettersDeleted int
	// MembersExpired is how many rows of consumer group members not seen
	// within MemberTTL (crashed, or cut off from the database) the pass
	// deleted (at most StepRows).
	MembersExpired int
	// Samples is how many queues' rows of the console's samples ring (one
	// sample a minute per queue, the last hour) the pass wrote: every
	// queue's in the first pass of a minute, by any process, else none.
	Samples int
}

// Maintain runs one maintenance pass now: retention, hash-row purge,
// idle-partition purge, dead-letter retention and the expiry of crashed
// consumer group members, in bounded steps. It reports Ran false when another
// process holds the maintenance lock. The background loop calls the same.
func (c *Client) Maintain(ctx context.Context) (MaintenanceReport, error) {
	if c.e.isClosed() {
		return MaintenanceReport{}, ErrClosed
	}
	rep, err := c.e.maint.Pass(ctx)
	if err != nil {
		return MaintenanceReport(rep), fmt.Errorf("queen: maintenance: %w", err)
	}
	return MaintenanceReport(rep), nil
}
