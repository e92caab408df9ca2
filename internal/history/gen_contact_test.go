package history_test

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// contactRace holds a SubscribeNew group's first contact open (its seeding
// done, not committed: a slow backend) while a message is pushed to a
// partition the group was seeded past and another group's pop empties that
// partition again. The new group must get the message once its contact
// commits: the other group's pop must not take the partition out of the
// ready set while a first contact is in flight. The seeding is the
// database function a first Pop calls; the test calls it to hold the
// transaction open, as the storm calls maintenance steps.
func (w *worker) contactRace(ctx context.Context) {
	late := lateGroups[0]
	q, stored := w.ownQueue(ctx, "contact", 1, false, history.QueueInfo{Groups: []string{"g1"}, LateGroups: []string{late}})
	if !stored {
		return
	}
	qq := w.c.Queue(q)
	drain := func() {
		o := queen.PopOptions{Group: "g1", AutoAck: true, Batch: 10}
		for range 5 {
			if len(recordPop(ctx, w.rec, w.proc, qq, o)) > 0 {
				return
			}
		}
	}
	drain() // g1 read p to its end: p leaves the ready set
	s := pgx.Identifier{w.r.schema}.Sanitize()
	tx, err := w.c.Pool().Begin(ctx)
	if err != nil {
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var qid int64
	if err := tx.QueryRow(ctx, "SELECT id FROM "+s+".queues WHERE name = $1", q).Scan(&qid); err != nil {
		return
	}
	start := time.Now().UnixNano()
	var seeded bool
	if err := tx.QueryRow(ctx, "SELECT "+s+".seed_consumers($1, $2, 'new', NULL)", qid, late).Scan(&seeded); err != nil || !seeded {
		return
	}
	end := time.Now().UnixNano()
	tx1 := q + "/n0"
	pushed := w.pushOwn(ctx, q, []queen.Item{{Partition: "p", TransactionID: tx1, Data: payload(q, tx1)}})
	if pushed {
		drain() // g1 takes n0: its pop clears p
	}
	if err := tx.Commit(ctx); err != nil {
		return // never subscribed: the final drain is the group's first contact
	}
	// The contact, as a Pop that delivered nothing, from before the seeding
	// to its end (the commit only makes it visible).
	seq := time.Now().UnixNano() // distinct from the worker's own sequence
	w.rec.Add(history.Event{Proc: "contact-seed", Seq: seq, Op: history.OpPop, Phase: history.Invoke, T: start, Queue: q, Group: late, Batch: 10})
	w.rec.Add(history.Event{Proc: "contact-seed", Seq: seq, Op: history.OpPop, Phase: history.OK, T: end, Queue: q, Group: late})
	if pushed {
		o := queen.PopOptions{Group: late, Subscription: queen.SubscribeNew, Batch: 10, LeaseTime: time.Second}
		for _, m := range recordPop(ctx, w.rec, w.proc, qq, o) {
			_ = recordSettle(ctx, w.rec, w.proc, m, "ack", nil)
		}
	}
}

// contactRaces runs contactRace about every second until ctx ends.
func (w *worker) contactRaces(ctx context.Context) {
	for ctx.Err() == nil {
		w.contactRace(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(500+w.rng.IntN(1000)) * time.Millisecond):
		}
	}
}
