package queen

import (
	"context"
	"fmt"
	"time"

	"github.com/e03140bc/queen/internal/stmt"
)

// QueueStatus is a snapshot of a queue's partitions and consumer groups.
type QueueStatus struct {
	Queue      string
	Partitions []PartitionStatus // by name; empty when the queue does not exist
	// Scheduled is how many messages pushed with an Item.DeliverAt wait
	// to be appended, and NextDue the earliest of their due times (zero
	// with none).
	Scheduled int64
	NextDue   time.Time
	// RetriesWaiting is how many failed messages of a FailureSkip queue
	// wait out their retry backoff before their copy is appended at the
	// partition's tail (not counted in Scheduled; see
	// QueueOptions.RetryBackoff).
	RetriesWaiting int64
	// Members are the live members of each consumer group by group name
	// ("" is queue mode), also of a group the queue has no partition for
	// yet; the same lists as GroupStatus.Members.
	Members map[string][]Member
}

// PartitionStatus is one partition's log and its groups' cursors.
type PartitionStatus struct {
	Name        string
	LastOffset  int64 // the newest offset; -1 when nothing was pushed
	LogStart    int64 // the oldest retained offset
	LastWriteAt time.Time
	Groups      []GroupStatus // by group name; "" is queue mode
}

// GroupStatus is one consumer group's cursor and lease on one partition.
type GroupStatus struct {
	Group     string
	Committed int64 // the last acked offset; -1 when none
	// Lag is the number of retained messages after Committed that the
	// group has still to read: messages Retention deleted unread are gone,
	// and the Settled ones will be skipped, so neither is lag. (The
	// consumer_lag view does not subtract Settled.)
	Lag int64
	// LagAge is how long the oldest unconsumed message has waited; 0 without lag.
	LagAge time.Duration
	// Leased reports a live lease on messages up to LeaseEnd.
	Leased     bool
	LeaseEnd   int64
	LeaseOwner string // host/pid/client of the lease holder, then '#' and its member id if it is a member
	// LeaseMember is the member id the lease owner carries: the holder is
	// a Consume call or a Pop naming itself (PopOptions.Member); "" for
	// another Pop or a client older than group membership.
	LeaseMember    string
	LeaseExpiresAt time.Time
	// LeaseHolderGone reports a live lease whose holder is no live member
	// of the group (LeaseMember is set and not among Members): its process
	// died or is cut off from the database, and the partition waits for
	// LeaseExpiresAt.
	LeaseHolderGone bool
	// Members are the group's live members (the same for every partition
	// of the queue): those whose last heartbeat is within MemberTTL, by
	// start.
	Members []Member
	// Abandoned reports lag on the partition and no live member of the
	// group to consume it.
	Abandoned bool
	// Failures is the retry budget spent by the message after Committed.
	Failures int
	// Settled is how many offsets above Committed were settled out of
	// order (per-key parallel Consume) and will be skipped; at most one
	// Batch.
	Settled int
	// KeysInFlight and KeysPaused are, while this client handles a batch
	// of the partition for the group with KeyConcurrency > 1, the ordering
	// keys with a handler running and those a failure paused in that batch.
	// They are this process's own numbers (another client's batches show
	// as 0), read when Status runs.
	KeysInFlight int
	KeysPaused   int
	// Paused reports the group paused on the queue (Queue.Pause).
	Paused bool
	// RetryAt is, while the message after Committed waits out its retry
	// backoff (QueueOptions.RetryBackoff, RetryAfter) after a failure, the
	// earliest time it is delivered again; zero when it does not wait.
	// Under per-key Consume (KeyConcurrency > 1) it is the earliest such
	// time among the partition's waiting messages, which need not be the
	// one after Committed (other keys go on meanwhile). Under FailureSkip the cursor does not wait: the failed message's
	// copy does, counted in QueueStatus.RetriesWaiting.
	RetryAt time.Time
}

// Status reports the queue's partitions with each group's committed offset,
// lag in messages and in age, lease holder and expiry, and live members. It reads every
// partition of the queue: meant for operators, not hot paths.
func (q *Queue) Status(ctx context.Context) (QueueStatus, error) {
	e := q.c.e
	st := QueueStatus{Queue: q.name}
	if e.isClosed() {
		return st, ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return st, err
	}
	rows, err := stmt.Status(ctx, e.csql, e.pool, stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, e.cfg.Citus)
	if err != nil {
		return st, fmt.Errorf("queen: status of %q: %w", q.name, err)
	}
	sched, due, retries, err := stmt.ScheduledStatus(ctx, e.sql, e.pool, stmt.QueueRef{Tenant: q.c.tenant, Name: q.name})
	if err != nil {
		return st, fmt.Errorf("queen: status of %q: %w", q.name, err)
	}
	st.Scheduled, st.RetriesWaiting = sched, retries
	mem, err := q.c.liveMembers(ctx, q.name)
	if err != nil {
		return st, fmt.Errorf("queen: status of %q: %w", q.name, err)
	}
	for k, ms := range mem.m {
		if st.Members == nil {
			st.Members = map[string][]Member{}
		}
		st.Members[k[1]] = ms
	}
	if due != nil {
		st.NextDue = *due
	}
	for _, r := range rows {
		n := len(st.Partitions)
		if n == 0 || st.Partitions[n-1].Name != r.Partition {
			st.Partitions = append(st.Partitions, PartitionStatus{Name: r.Partition, LastOffset: r.LastOffset,
				LogStart: r.LogStart, LastWriteAt: r.LastWriteAt})
			n++
		}
		if r.Group == nil {
			continue
		}
		g := GroupStatus{Group: *r.Group, Committed: *r.Committed, Failures: int(r.Attempts), Paused: r.Paused}
		if r.RetryAt != nil {
			g.RetryAt = *r.RetryAt
		}
		if r.Settled != nil {
			g.Settled = int(*r.Settled)
		}
		if f, p, ok := e.keyStats.get(keyStatKey{q.c.tenant, q.name, g.Group, st.Partitions[n-1].Name}); ok {
			g.KeysInFlight, g.KeysPaused = int(f), int(p)
		}
		// Lag as the consumer_lag view counts it (SQL lag_messages), less
		// the settled offsets.
		if r.Lag != nil {
			g.Lag = *r.Lag
		}
		if g.Lag > 0 && r.HeadAt != nil {
			g.LagAge = max(r.Now.Sub(*r.HeadAt), 0)
		}
		if r.BatchEnd != nil && r.LeaseExpires != nil && r.LeaseExpires.After(r.Now) {
			g.Leased, g.LeaseEnd, g.LeaseExpiresAt = true, *r.BatchEnd, *r.LeaseExpires
			if r.Owner != nil {
				g.LeaseOwner = *r.Owner
				g.LeaseMember = memberOf(g.LeaseOwner)
			}
		}
		if mem.known {
			g.Members = mem.of(q.name, g.Group)
			g.Abandoned = g.Lag > 0 && len(g.Members) == 0
			g.LeaseHolderGone = g.LeaseMember != "" && !mem.has(q.name, g.Group, g.LeaseMember)
		}
		st.Partitions[n-1].Groups = append(st.Partitions[n-1].Groups, g)
	}
	return st, nil
}
