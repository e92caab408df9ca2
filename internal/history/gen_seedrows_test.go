package history_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// seedRows races the first cursor rows of a group already subscribed
// against retention_step, for as long as ctx lasts. On a queue of its own
// with CompletedRetention, "base" and "late" make first contact before any
// partition exists, so no later pop of theirs takes the queue's contact
// lock (which completed retention defers to). Each round pushes one
// message to each of a few new partitions and base reads them all: they
// are due at once, held back only by late's subscription. Then late pops
// one message with a window over them, which seeds late's cursor rows on
// all of them and claims one, while connections of the generator run
// retention_step on them in a tight loop. Retention must count late by
// its subscription or by its new row, never by neither: what it deletes
// under a row it did not see is owed to late (never-delivered). Late then
// reads the round. Two such loops run at once, each a chance a round:
// a round is several calls, slow on a loaded machine.
func (r *run) seedRows(ctx context.Context, cs []*queen.Client) {
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { r.seedRowsLoop(ctx, i, cs[i%len(cs)], rand.New(rand.NewPCG(r.seed, 0xc5eed+uint64(i)))) })
	}
	wg.Wait()
}

func (r *run) seedRowsLoop(ctx context.Context, loop int, c *queen.Client, rng *rand.Rand) {
	const steppers = 4
	conns := make([]*pgx.Conn, steppers)
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close(context.Background())
			}
		}
	}()
	var st seedStats
	defer func() {
		r.t.Logf("seedrows: loop %d: %d queues, %d rounds (%d pushes failed, %d spooled), %d first pops raced, %d cursors below the log start",
			loop, st.queues, st.rounds, st.failed, st.spooled, st.raced, st.under)
	}()
	var sq *seedQueue
	for ctx.Err() == nil {
		for i, conn := range conns {
			if conn == nil || conn.IsClosed() {
				var err error
				if conns[i], err = pgx.Connect(ctx, r.url()); err != nil {
					conns[i] = nil
				}
			}
		}
		if slices.Contains(conns, nil) {
			sleepCtx(ctx, 100*time.Millisecond) // the database is down
			continue
		}
		if sq == nil {
			// A queue whose pushes were spooled (an outage) spools the
			// later ones behind them until a replay: a fresh one then.
			if sq = r.newSeedQueue(ctx, c); sq == nil {
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			st.queues++
		}
		st.rounds++
		if !sq.round(ctx, conns, rng, &st) {
			sq = nil
			sleepCtx(ctx, 500*time.Millisecond) // the client spools while the database is down
		}
	}
}

type seedStats struct{ queues, rounds, failed, spooled, raced, under int }

type seedQueue struct {
	r      *run
	name   string
	q      *queen.Queue
	rounds int
}

// pop pops with AutoAck (one call less than an ack; one of unknown outcome
// excuses its Batch for its group).
func (sq *seedQueue) pop(ctx context.Context, g string, batch int, part string) ([]*queen.Message, error) {
	return recordPopErr(ctx, sq.r.rec, "cseed", sq.q, queen.PopOptions{Group: g, Batch: batch, Partitions: batch, Partition: part, AutoAck: true})
}

// newSeedQueue configures a fresh queue, due as soon as read, and makes
// base's and late's first contacts; nil if the database is down.
func (r *run) newSeedQueue(ctx context.Context, c *queen.Client) *seedQueue {
	sq := &seedQueue{r: r, name: fmt.Sprintf("cseed-%d", r.fresh.Add(1))}
	sq.q = c.Queue(sq.name)
	r.addQueue(sq.name, history.QueueInfo{Deduped: true, Completed: true, Groups: []string{"base", "late"}})
	if err := sq.q.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, CompletedRetention: time.Millisecond, LeaseTime: 2 * time.Second}); err != nil {
		return nil
	}
	for _, g := range []string{"base", "late"} {
		if _, err := sq.pop(ctx, g, 1, "none"); err != nil {
			return nil
		}
	}
	return sq
}

// round pushes to new partitions, has base read them and races late's
// window pop over them against retention_step; false if the queue is
// spent (its push was spooled or failed).
func (sq *seedQueue) round(ctx context.Context, conns []*pgx.Conn, rng *rand.Rand, ss *seedStats) bool {
	const parts = 8
	r, q := sq.r, sq.q
	sq.rounds++
	items := make([]queen.Item, parts)
	names := make([]string, parts)
	for i := range items {
		names[i] = fmt.Sprintf("r%d-%d", sq.rounds, i)
		tx := fmt.Sprintf("%s/%s", sq.name, names[i])
		items[i] = queen.Item{Partition: names[i], TransactionID: tx, Data: payload(sq.name, tx)}
	}
	inv := r.rec.Invoke(history.Event{Proc: "cseed", Op: history.OpPush, Queue: sq.name, Items: histItems(items)})
	// Push must not fail for the run's end: it would be Buffered, not an error.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	res, err := q.Push(pctx, items)
	cancel()
	if err != nil {
		r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		ss.failed++
		return false
	}
	r.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
	for _, x := range res {
		if x.Status != queen.Queued {
			ss.spooled++
			return false // the final drain reads it
		}
	}
	read := 0
	for try := 0; try < 4 && read < parts && ctx.Err() == nil; try++ {
		msgs, _ := sq.pop(ctx, "base", parts, "")
		read += len(msgs)
	}
	if read == 0 {
		return true // nothing due: no race
	}
	s := pgx.Identifier{r.schema}.Sanitize()
	rows, err := conns[0].Query(ctx, fmt.Sprintf(`SELECT p.id, p.name FROM %[1]s.partitions p JOIN %[1]s.queues q ON q.id = p.queue_id
		WHERE q.name = $1 AND p.name = ANY ($2)`, s), sq.name, names)
	if err != nil {
		conns[0].Close(context.Background())
		return true
	}
	type part struct {
		ID   int64
		Name string
	}
	ps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[part])
	if err != nil || len(ps) == 0 {
		return true
	}
	pids := make([]int64, len(ps))
	for i, p := range ps {
		pids[i] = p.ID
	}
	// Plans discarded: each statement of the step is planned again, and the
	// planning of its second read falls after the first one's snapshot,
	// which widens the window (about twice the catches of cached plans).
	step := `DISCARD PLANS; SELECT ` + s + `.retention_step(%d, 1000)`
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Go(func() {
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				pid := pids[(i+j*len(conns))%len(pids)]
				if _, err := conn.Exec(ctx, fmt.Sprintf(step, pid), pgx.QueryExecModeSimpleProtocol); err != nil {
					conn.Close(context.Background())
					return
				}
			}
		})
	}
	sleepCtx(ctx, time.Duration(rng.IntN(1000))*time.Microsecond)
	// One message of one partition: the window seeds late's rows on the
	// others, which it leaves unclaimed.
	_, err = sq.pop(ctx, "late", 1, "")
	close(stop)
	wg.Wait()
	if err == nil {
		ss.raced++
	}
	var under int
	if conns[0].QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %[1]s.partitions p JOIN %[1]s.consumers c ON c.partition_id = p.id
		WHERE p.id = ANY ($1) AND c.group_name = 'late' AND c.committed < p.log_start - 1`, s), pids).Scan(&under) == nil {
		ss.under += under
	}
	// Late reads the round: its next window holds the next round's
	// partitions only. What it misses, the final drain reads.
	_, _ = sq.pop(ctx, "late", parts, "")
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
