package queen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/e03140bc/queen/internal/stmt"
)

// MemberTTL is how long a member is live after its last heartbeat: readers
// (Queue.Status, Client.Queues) count a row older than this as gone, and
// maintenance deletes it. Six heartbeats, so a member is shown gone only
// once it missed five in a row (a long GC pause, a slow statement on a
// loaded server, a failover's reconnect), yet a crashed one is noticed
// within half a minute, like Kafka's session timeout.
const MemberTTL = 30 * time.Second

// maxMember bounds PopOptions.Member.
const maxMember = 128

// Member is a live member of a consumer group: a running Consume call, or a
// Pop caller that names itself (PopOptions.Member).
type Member struct {
	// ID is the member's id: Consume makes one per call; a Pop member's is
	// its PopOptions.Member.
	ID string
	// Client is the name of the client it runs in, as lease owners carry
	// it (host/pid/random); Host and PID are that client's.
	Client string
	Host   string
	PID    int
	// Started is when it joined; LastSeen its latest heartbeat.
	Started  time.Time
	LastSeen time.Time
}

// member is one group member of this process: a Consume call, or a Pop
// with PopOptions.Member (then only id and owner are used).
type member struct {
	id    string
	owner string // the lease owner its claims write: the client's, '#', id
	// carried is when (Unix ns) a claim or a renewal of the member last
	// carried its heartbeat: the idle heartbeat is only sent without one.
	carried atomic.Int64
}

// leaseOwner is the lease owner m's claims write: def when m is nil.
func (m *member) leaseOwner(def string) string {
	if m == nil {
		return def
	}
	return m.owner
}

// carry notes a round trip that carried m's heartbeat.
func (m *member) carry() {
	if m != nil {
		m.carried.Store(time.Now().UnixNano())
	}
}

// memberOf is the member id lease owner owner carries ("" for none), as
// the member_of SQL function reads it.
func memberOf(owner string) string {
	_, id, ok := strings.Cut(owner, "#")
	if !ok {
		return ""
	}
	return id
}

func checkMember(id string) error {
	if len(id) > maxMember || !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
		return fmt.Errorf("queen: PopOptions.Member must be at most %d bytes of UTF-8 without NUL", maxMember)
	}
	return nil
}

// newMemberID is a Consume call's member id: random, unique in practice.
func newMemberID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// join makes c a member of its group until the returned func is called,
// which deletes the member row: it writes the row now and whenever no
// claim or renewal carried a heartbeat for DefaultMemberHeartbeat.
func (c *consumer) join() (leave func()) {
	e := c.q.c.e
	host, _ := os.Hostname()
	p := stmt.MemberParams{Queue: stmt.QueueRef{Tenant: c.q.c.tenant, Name: c.q.name}, Group: c.po.Group,
		Member: c.mem.id, Client: e.owner, Host: host, PID: os.Getpid(), Started: time.Now()}
	every := e.cfg.test.memberHeartbeat
	beat := func() {
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.StatementTimeout)
		ok, err := stmt.MemberBeat(ctx, e.csql, e.pool, p)
		cancel()
		switch {
		case err != nil && !e.isClosed():
			e.log.Warn("queen: consume: member heartbeat failed", "queue", c.q.name, "group", c.po.Group, "err", err)
		case ok:
			c.mem.carry()
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		beat()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-e.ctx.Done():
				return
			case <-t.C:
			}
			if time.Since(time.Unix(0, c.mem.carried.Load())) >= every {
				beat()
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
		defer cancel()
		if err := stmt.MemberLeave(ctx, e.csql, e.pool, p); err != nil && !e.isClosed() {
			e.log.Warn("queen: consume: could not delete the member row; it expires after MemberTTL",
				"queue", c.q.name, "group", c.po.Group, "err", err)
		}
	}
}

// LeaveGroup deletes the member row of a Pop caller that named itself
// member (PopOptions.Member) of group ("" is queue mode), so it is not
// shown until it pops again; otherwise it goes MemberTTL after its last
// pop. Leases it holds are not affected. Leaving a group one is not a
// member of does nothing.
func (q *Queue) LeaveGroup(ctx context.Context, group, member string) error {
	e := q.c.e
	if err := q.checkGroup(group); err != nil {
		return err
	}
	if err := checkMember(member); err != nil {
		return err
	}
	err := stmt.MemberLeave(ctx, e.csql, e.pool, stmt.MemberParams{Queue: stmt.QueueRef{Tenant: q.c.tenant, Name: q.name},
		Group: group, Member: member})
	if err != nil {
		return fmt.Errorf("queen: leave group %q of %q: %w", group, q.name, err)
	}
	return nil
}

// groupMembers is the live members of a tenant's queues by queue and group.
type groupMembers struct {
	known bool // false: the statements have no members (a previous release's)
	m     map[[2]string][]Member
}

func (g groupMembers) of(queue, group string) []Member { return g.m[[2]string{queue, group}] }

// has reports whether id is a live member of queue's group.
func (g groupMembers) has(queue, group, id string) bool {
	for _, m := range g.of(queue, group) {
		if m.ID == id {
			return true
		}
	}
	return false
}

// liveMembers reads the live members of the client's tenant's queues (of
// queue only, unless "").
func (c *Client) liveMembers(ctx context.Context, queue string) (groupMembers, error) {
	e := c.e
	var qp *string
	if queue != "" {
		qp = &queue
	}
	rows, known, err := stmt.Members(ctx, e.csql, e.pool, c.tenant, qp, e.cfg.test.memberTTL)
	if err != nil {
		return groupMembers{}, err
	}
	g := groupMembers{known: known, m: map[[2]string][]Member{}}
	for _, r := range rows {
		k := [2]string{r.Queue, r.Group}
		g.m[k] = append(g.m[k], Member{ID: r.Member, Client: r.Client, Host: r.Host, PID: int(r.PID),
			Started: r.Started, LastSeen: r.LastSeen})
	}
	return g, nil
}
