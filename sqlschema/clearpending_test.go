package sqlschema_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// One round's partition as the rule reads it.
type cpPart struct {
	id, queue        int64
	last, start      int64
	pending          bool
	heldElsewhere    bool             // row locked by another transaction
	committed        map[string]int64 // by group; missing: no cursor row
	seed             map[string]int64 // seed_offset by group, for a missing row
	groups           []string         // the queue's subscriptions
	contactElsewhere bool             // the queue's contact lock held exclusively
}

type backlogKey struct {
	queue int64
	group string
	pid   int64
}

// clear_pending_many (and, on the routed layout, clear_pending_routed for
// each partition; in some rounds clear_pending, its one-partition form,
// called for each) against the rule written out in Go: for each partition
// passed that no one else holds, if it is pending and no first contact
// holds its queue's contact lock, every subscribed group behind on it gets
// a backlog row and the flag is cleared; then the calling group's backlog
// row goes if that group consumed everything retained. A pending partition
// of a queue under a first contact is left whole. Random rounds over two
// queues, three groups (two subscription modes), cursors missing or at any
// offset, stray backlog rows, one partition held by another transaction
// and, in some rounds, a first contact in progress on one queue.
func TestClearPendingManyIsThePlainRule(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	rng := rand.New(rand.NewPCG(7, 31))
	for round := range 60 {
		routed := round%4 == 3
		if _, err := pool.Exec(ctx, "UPDATE "+s+".settings SET routed = $1", routed); err != nil {
			t.Fatal(err)
		}
		parts, backlog := cpSetup(t, ctx, pool, s, rng)
		group := []string{"g1", "g2", "g3"}[rng.IntN(3)]
		var call []int64
		for _, p := range parts {
			if rng.IntN(4) != 0 {
				call = append(call, p.id)
			}
		}
		if len(call) > 1 {
			call = append(call, call[0]) // a partition passed twice
		}
		// The expected state, from the state before the call.
		want := map[backlogKey]bool{}
		for k := range backlog {
			want[k] = true
		}
		wantPending := map[int64]bool{}
		for _, p := range parts {
			wantPending[p.id] = p.pending
		}
		for _, p := range parts {
			if !slices.Contains(call, p.id) || p.heldElsewhere {
				continue
			}
			if p.pending {
				if p.contactElsewhere {
					continue
				}
				for _, g := range p.groups {
					c, ok := p.committed[g]
					if !ok {
						c = p.seed[g]
					}
					if p.last >= p.start && c < p.last {
						want[backlogKey{p.queue, g, p.id}] = true
					}
				}
				wantPending[p.id] = false
			}
			if c, ok := p.committed[group]; p.last < p.start || (ok && c >= p.last) {
				delete(want, backlogKey{p.queue, group, p.id})
			}
		}

		// Another transaction holds one partition; a first contact holds
		// one queue's contact lock.
		hold, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		contact, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			if p.heldElsewhere {
				if _, err := hold.Exec(ctx, "SELECT 1 FROM "+s+".partitions WHERE id = $1 FOR UPDATE", p.id); err != nil {
					t.Fatal(err)
				}
			}
		}
		var contactQueue int64
		for _, p := range parts {
			if p.contactElsewhere {
				contactQueue = p.queue
			}
		}
		if contactQueue != 0 {
			if _, err := contact.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))",
				fmt.Sprintf("queen/%s/contact/%d", schema, contactQueue)); err != nil {
				t.Fatal(err)
			}
		}
		if round%5 == 1 {
			// The one-partition form, a call each.
			for _, id := range call {
				if _, err = pool.Exec(ctx, "SELECT "+s+".clear_pending($1, $2)", id, group); err != nil {
					break
				}
			}
		} else {
			_, err = pool.Exec(ctx, "SELECT "+s+".clear_pending_many($1, $2, $3)", call, group, routed)
		}
		if contactQueue != 0 {
			if _, uerr := contact.Exec(ctx, "SELECT pg_advisory_unlock_all()"); uerr != nil {
				t.Fatal(uerr)
			}
		}
		contact.Release()
		if rerr := hold.Rollback(ctx); rerr != nil {
			t.Fatal(rerr)
		}
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}

		gotPending, gotBacklog := cpState(t, ctx, pool, s, parts)
		for _, p := range parts {
			if gotPending[p.id] != wantPending[p.id] {
				t.Errorf("round %d (routed %v, group %s): partition %+v pending %v, want %v",
					round, routed, group, *p, gotPending[p.id], wantPending[p.id])
			}
		}
		for k := range want {
			if !gotBacklog[k] {
				t.Errorf("round %d (routed %v, group %s): backlog row %+v missing", round, routed, group, k)
			}
		}
		for k := range gotBacklog {
			if !want[k] {
				t.Errorf("round %d (routed %v, group %s): backlog row %+v not wanted", round, routed, group, k)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
}

// cpSetup makes two queues of random partitions, subscriptions, cursors
// and backlog rows, and returns the partitions and the backlog.
func cpSetup(t *testing.T, ctx context.Context, pool *pgxpool.Pool, s string, rng *rand.Rand) ([]*cpPart, map[backlogKey]bool) {
	t.Helper()
	var parts []*cpPart
	backlog := map[backlogKey]bool{}
	contactQueue := rng.IntN(3) // 0 or 1: that queue; 2: none
	for qi := range 2 {
		var qid int64
		if err := pool.QueryRow(ctx, "INSERT INTO "+s+".queues (tenant, name) VALUES (gen_random_uuid(), 'q' || gen_random_uuid()) RETURNING id").Scan(&qid); err != nil {
			t.Fatal(err)
		}
		groups := []string{"g1", "g2", "g3"}[:1+rng.IntN(3)]
		for _, g := range groups {
			mode := []string{"all", "new"}[rng.IntN(2)]
			if _, err := pool.Exec(ctx, "INSERT INTO "+s+".subscriptions (queue_id, group_name, mode, created_at) VALUES ($1, $2, $3, now() - $4 * interval '1 second')",
				qid, g, mode, rng.IntN(3)-1); err != nil {
				t.Fatal(err)
			}
		}
		for pi := range 10 {
			p := &cpPart{committed: map[string]int64{}, seed: map[string]int64{}, groups: groups,
				contactElsewhere: contactQueue == qi}
			p.last = int64(rng.IntN(12)) - 1
			p.start = int64(rng.IntN(int(p.last) + 3))
			p.pending = rng.IntN(3) != 0
			if err := pool.QueryRow(ctx, "INSERT INTO "+s+".partitions (id, queue_id, name, last_offset, log_start, pending) "+
				"VALUES ("+s+".partition_key($1, $2, 0), $1, $2, $3, $4, $5) RETURNING id",
				qid, fmt.Sprint("p", pi), p.last, p.start, p.pending).Scan(&p.id); err != nil {
				t.Fatal(err)
			}
			p.queue = qid
			for _, g := range []string{"g1", "g2", "g3"} {
				if rng.IntN(3) != 0 {
					c := int64(rng.IntN(int(p.last)+3)) - 1
					if _, err := pool.Exec(ctx, "INSERT INTO "+s+".consumers (partition_id, group_name, committed) VALUES ($1, $2, $3)", p.id, g, c); err != nil {
						t.Fatal(err)
					}
					p.committed[g] = c
				}
				if rng.IntN(3) == 0 {
					if _, err := pool.Exec(ctx, "INSERT INTO "+s+".backlog (queue_id, group_name, partition_id) VALUES ($1, $2, $3)", qid, g, p.id); err != nil {
						t.Fatal(err)
					}
					backlog[backlogKey{qid, g, p.id}] = true
				}
			}
			for _, g := range groups {
				var seed int64
				if err := pool.QueryRow(ctx, "SELECT "+s+".seed_offset(p.id, p.log_start, p.created_at, sub.mode, sub.created_at, sub.from_time) "+
					"FROM "+s+".partitions p JOIN "+s+".subscriptions sub ON sub.queue_id = p.queue_id AND sub.group_name = $2 WHERE p.id = $1",
					p.id, g).Scan(&seed); err != nil {
					t.Fatal(err)
				}
				p.seed[g] = seed
			}
			parts = append(parts, p)
		}
	}
	parts[rng.IntN(len(parts))].heldElsewhere = true
	return parts, backlog
}

// cpState reads the pending flags of parts and every backlog row of their
// queues.
func cpState(t *testing.T, ctx context.Context, pool *pgxpool.Pool, s string, parts []*cpPart) (map[int64]bool, map[backlogKey]bool) {
	t.Helper()
	pending := map[int64]bool{}
	backlog := map[backlogKey]bool{}
	queues := map[int64]bool{}
	for _, p := range parts {
		var b bool
		if err := pool.QueryRow(ctx, "SELECT pending FROM "+s+".partitions WHERE id = $1", p.id).Scan(&b); err != nil {
			t.Fatal(err)
		}
		pending[p.id] = b
		queues[p.queue] = true
	}
	for q := range queues {
		rows, err := pool.Query(ctx, "SELECT group_name, partition_id FROM "+s+".backlog WHERE queue_id = $1", q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			k := backlogKey{queue: q}
			if err := rows.Scan(&k.group, &k.pid); err != nil {
				t.Fatal(err)
			}
			backlog[k] = true
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return pending, backlog
}
