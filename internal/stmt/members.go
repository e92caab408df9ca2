package stmt

import (
	"context"
	"time"

	"github.com/gofrs/uuid/v5"
)

// MemberParams names one consumer group member of a queue.
type MemberParams struct {
	Queue  QueueRef
	Group  string
	Member string // the member id
	// Client, Host and PID describe the client it runs in; Started is
	// when it joined. MemberLeave reads none of them.
	Client  string
	Host    string
	PID     int
	Started time.Time
}

// MemberBeat runs c.MemberBeat on q: it creates the member's row or
// refreshes its last_seen, and reports false when the queue does not
// exist. A previous release has no such statement (see Use): it reports
// false.
func MemberBeat(ctx context.Context, c *Consume, q Querier, in MemberParams) (bool, error) {
	if c.MemberBeat == "" {
		return false, nil
	}
	var ok bool
	err := scanPrefix(ctx, q, c.MemberBeat, []any{in.Queue.Tenant, in.Queue.Name, in.Group, in.Member, in.Client,
		in.Host, int32(in.PID), in.Started}, &ok)
	return ok, err
}

// MemberLeave runs c.MemberLeave on q: it deletes the member's row.
func MemberLeave(ctx context.Context, c *Consume, q Querier, in MemberParams) error {
	if c.MemberLeave == "" {
		return nil
	}
	rows, err := q.Query(ctx, c.MemberLeave, in.Queue.Tenant, in.Queue.Name, in.Group, in.Member)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// MemberRow is one row of Members: a live member of a queue's group.
type MemberRow struct {
	Queue, Group, Member string
	Client, Host         string
	PID                  int32
	Started, LastSeen    time.Time
}

// Members runs c.Members on q: the members of tenant's queues (of queue
// only, unless nil) seen within ttl, by queue, group and start. ok is
// false with a previous release's statements (see Use), which have none.
func Members(ctx context.Context, c *Consume, q Querier, tenant uuid.UUID, queue *string, ttl time.Duration) (rows []MemberRow, ok bool, err error) {
	if c.Members == "" {
		return nil, false, nil
	}
	rs, err := q.Query(ctx, c.Members, tenant, queue, max(ttl.Milliseconds(), 1))
	if err != nil {
		return nil, true, err
	}
	defer rs.Close()
	for rs.Next() {
		var r MemberRow
		if err := rs.Scan(&r.Queue, &r.Group, &r.Member, &r.Client, &r.Host, &r.PID, &r.Started, &r.LastSeen); err != nil {
			return nil, true, err
		}
		rows = append(rows, r)
	}
	return rows, true, rs.Err()
}

// ExpireMembers runs s.ExpireMembers on q: it deletes the rows of members
// not seen within ttl, at most maxRows, and returns how many. A previous
// release has no such statement (see Use): it deletes none.
func ExpireMembers(ctx context.Context, s *Set, q Querier, ttl time.Duration, maxRows int) (int, error) {
	if s.ExpireMembers == "" {
		return 0, nil
	}
	var n int32
	err := scanPrefix(ctx, q, s.ExpireMembers, []any{max(ttl.Milliseconds(), 1), int32(maxRows)}, &n)
	return int(n), err
}
