package queen

import (
	"time"

	"github.com/e03140bc/queen/fusion"
)

// The defaults of every option a zero value leaves to the library, in one
// place. Each option's documentation names its constant.

// Config.
const (
	// DefaultStatementTimeout is the default of Config.StatementTimeout.
	DefaultStatementTimeout = 30 * time.Second
	// DefaultMaxBufferedBytes is the default of
	// FusionConfig.MaxBufferedBytes: 256 MiB.
	DefaultMaxBufferedBytes = fusion.DefaultMaxBufferedBytes
	// DefaultFusionShards is the default of FusionConfig.Shards.
	DefaultFusionShards = 8
	// DefaultBundleMax is the default of FusionConfig.BundleMax.
	DefaultBundleMax = 256
	// DefaultBundleBase is the default of FusionConfig.BundleBase.
	DefaultBundleBase = 16
	// DefaultFusionHold is the default of FusionConfig.Hold.
	DefaultFusionHold = 15 * time.Millisecond
)

// MaintenanceConfig.
const (
	// DefaultMaintenanceInterval is the default of MaintenanceConfig.Interval.
	DefaultMaintenanceInterval = time.Second
	// DefaultIdlePartition is the default of MaintenanceConfig.IdlePartition.
	DefaultIdlePartition = 24 * time.Hour
	// DefaultHashFloor is the default of MaintenanceConfig.HashFloor.
	DefaultHashFloor = 10 * time.Minute
	// DefaultStepPartitions is the default of
	// MaintenanceConfig.StepPartitions.
	DefaultStepPartitions = 256
	// DefaultStepRows is the default of MaintenanceConfig.StepRows.
	DefaultStepRows = 1000
)

// The samples ring behind Queue.Samples (the console's charts): the
// maintenance pass takes one sample of every queue per SampleInterval of
// the database clock and keeps the last SamplesKept, an hour.
const (
	SampleInterval = time.Minute
	SamplesKept    = 60
)

// QueueOptions.
const (
	// DefaultLeaseTime is the default of QueueOptions.LeaseTime.
	DefaultLeaseTime = 5 * time.Minute
	// DefaultRetryLimit is the default of QueueOptions.RetryLimit.
	DefaultRetryLimit = 3
	// DefaultLanes is the default of QueueOptions.Lanes.
	DefaultLanes = 64
	// DefaultRetryBackoffMin is the default RetryBackoff.Min: a one-second
	// first wait rides out a blip (a dropped connection, a failover) that
	// an immediate retry would hit again.
	DefaultRetryBackoffMin = time.Second
	// DefaultRetryBackoffMax is the default RetryBackoff.Max. Doubling from
	// one second reaches the minute a downstream takes to restart within a
	// few failures; capping at five minutes keeps the total delay bounded
	// by RetryLimit (with the default 3, two waits of at most 2 s and 4 s;
	// with 10, under 14 minutes in all) and a recovered downstream is found
	// again within five minutes.
	DefaultRetryBackoffMax = 5 * time.Minute
)

// ConsumeOptions, PeekOptions and membership.
const (
	// DefaultMaxHold is the default of ConsumeOptions.MaxHold: three times
	// Kafka's max.poll.interval.ms, long enough for slow work such as a
	// large upload, short enough that a handler stuck on a call without a
	// deadline gives its partition back within the quarter hour.
	DefaultMaxHold = 15 * time.Minute
	// DefaultMemberHeartbeat is how often a Consume writes its member row
	// when nothing else has lately: a claim or a lease renewal of the
	// Consume is its heartbeat too (written at most once a second), so a
	// busy one sends no heartbeat of its own; one with every worker on a
	// long handler, or one whose claims fail, sends one every five
	// seconds. Often enough that a live member's row is never near
	// MemberTTL old, rare enough to cost nothing (Kafka's consumers
	// heartbeat every three seconds).
	DefaultMemberHeartbeat = 5 * time.Second
	// DefaultPeekLimit is the most messages a Peek returns when
	// PeekOptions.Limit is 0.
	DefaultPeekLimit = 100
)
