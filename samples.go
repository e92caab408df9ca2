package queen

import (
	"context"
	"fmt"
	"time"

	"github.com/e03140bc/queen/internal/stmt"
)

// QueueSamples is a queue's recent history from the samples ring that
// maintenance writes: running totals, one sample per SampleInterval, the
// last SamplesKept of them (an hour). Rates are differences of successive
// samples over their time apart; a total that went down (an idle partition
// purged, a group reset or deleted) is a reset, not a negative rate.
type QueueSamples struct {
	// Now is the database clock when they were read: the samples' times are
	// on that clock, not the caller's.
	Now time.Time
	// Interval is how far apart samples are taken (SampleInterval); a
	// longer gap means passes were missed (no process running maintenance).
	Interval time.Duration
	// Samples, oldest first; none for a queue that does not exist or was
	// created since the last sample.
	Samples []Sample
}

// Sample is one sample of a queue.
type Sample struct {
	At time.Time
	// Pushed is how many messages the queue's partitions were ever given,
	// as QueueInfo.Pushed counts.
	Pushed int64
	// Groups are the groups subscribed to the queue (those that have
	// popped from it), by name ("" is queue mode).
	Groups []GroupSample
}

// GroupSample is one consumer group in a Sample.
type GroupSample struct {
	Group string
	// Consumed is how far the group's cursors have moved, summed over the
	// partitions (each cursor's committed offset + 1; on a partition the
	// group has not reached yet, where its cursor will start): settled
	// messages, for rates.
	Consumed int64
	// Lag is the group's lag, as QueueGroupInfo.Lag counts it.
	Lag int64
}

// Samples returns the queue's samples of the last SamplesKept intervals
// (one indexed read of at most SamplesKept rows). Samples are taken by the
// process that runs maintenance (Config.Maintenance): with none running,
// there are no new ones.
func (q *Queue) Samples(ctx context.Context) (QueueSamples, error) {
	e := q.c.e
	if e.isClosed() {
		return QueueSamples{}, ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return QueueSamples{}, err
	}
	every := e.cfg.test.sampleInterval
	rows, now, err := stmt.Samples(ctx, e.sql, e.pool, stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, every*SamplesKept)
	if err != nil {
		return QueueSamples{}, fmt.Errorf("queen: samples of %q: %w", q.name, err)
	}
	out := QueueSamples{Now: now, Interval: every, Samples: make([]Sample, len(rows))}
	for i, r := range rows {
		s := Sample{At: r.At, Pushed: r.Pushed, Groups: make([]GroupSample, len(r.Groups))}
		for j, g := range r.Groups {
			s.Groups[j] = GroupSample{Group: g, Consumed: r.Consumed[j], Lag: r.Lag[j]}
		}
		out.Samples[i] = s
	}
	return out, nil
}
