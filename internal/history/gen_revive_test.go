package history_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// The "revive" generator: a spool replay pass halted by failures in a row
// (2 × the spool's ReplayConcurrency of 8) while one replay call is still
// running, which then succeeds. The pass must stay halted: its workers
// skipped partitions without blocking them, so going on to the next chunk
// would store a partition's later records before its skipped ones.
//
// A client of its own spools, in a maintenance window of its own and one
// push per partition (a push's partitions reach the spool in no set
// order): a's record, then 40 filler partitions' records, then x's first
// record, 1000 records in all (one replay chunk), then x's second (the
// next chunk). With a's partition row and the first ten fillers' held by
// other connections, the window ends: the pass's eight workers each wait
// on their first call. The client turns maintenance on again and the
// fillers' rows are released: their calls succeed and the next ones fail
// at once (maintenance), 16 in a row, while a's call still waits. Then
// maintenance ends and a's row is released: a's call succeeds. x's second
// record stored before its first is a client-order violation.
type reviver struct {
	r    *run
	c    *queen.Client
	n    int // rounds begun
	done int // rounds that went through
}

const (
	rvProc    = "revive"
	rvChunk   = 1000 // the spool's default ReplayBatchRecords
	rvFillers = 40   // past the 8 workers' first calls and 16 failures
	rvLocked  = 10   // fillers held with a: every worker's first call waits
	rvRounds  = 2
)

// openRevive opens the generator's client; before scanSpools reads
// r.spoolDirs.
func (r *run) openRevive(ctx context.Context) *reviver {
	dir := r.t.TempDir()
	r.spoolDirs = append(r.spoolDirs, dir)
	cfg := r.config(rvProc, dir)
	// Connections for SetMaintenance while the replay's bundles hold theirs
	// waiting on the rows.
	cfg.DatabaseURL += "&pool_max_conns=24"
	// a's call waits a second or two on its row: it must then succeed.
	cfg.StatementTimeout = 20 * time.Second
	return &reviver{r: r, c: r.openCfg(ctx, cfg)}
}

func (v *reviver) loop(gen context.Context) {
	for v.done < rvRounds && gen.Err() == nil {
		// A round ends what it began even once the run's generation ended.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(gen), 40*time.Second)
		v.round(ctx)
		cancel()
		select {
		case <-gen.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (v *reviver) push(ctx context.Context, q string, items []queen.Item) ([]queen.PushResult, error) {
	inv := v.r.rec.Invoke(history.Event{Proc: rvProc, Op: history.OpPush, Queue: q, Items: histItems(items)})
	res, err := v.c.Queue(q).Push(ctx, items)
	if err != nil {
		v.r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
	} else {
		v.r.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
	}
	return res, err
}

// holdRows holds q's partition rows parts until release; pid is the
// holder's backend, 0 if not every row was held.
func (v *reviver) holdRows(ctx context.Context, q string, parts []string) (pid int32, release func()) {
	conn, err := pgx.Connect(ctx, v.r.url())
	if err != nil {
		return 0, func() {}
	}
	release = func() { conn.Close(context.Background()) } // ends the transaction
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return 0, release
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, release
	}
	tag, err := tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %[1]s.partitions p JOIN %[1]s.queues q ON q.id = p.queue_id
		WHERE q.name = $1 AND p.name = ANY($2) FOR NO KEY UPDATE OF p`, pgx.Identifier{v.r.schema}.Sanitize()), q, parts)
	if err != nil || tag.RowsAffected() != int64(len(parts)) {
		return 0, release
	}
	return pid, release
}

// waiters counts the backends waiting on pid's locks (0 on an error).
func waiters(ctx context.Context, conn *pgx.Conn, pid int32) int {
	var n int
	if conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pid).Scan(&n) != nil {
		return 0
	}
	return n
}

func (v *reviver) round(ctx context.Context) {
	if !waitUntil(5*time.Second, func() bool { return !v.c.Maintenance() && v.c.SpoolStats().PendingRecords == 0 }) {
		return
	}
	v.n++
	stage := "set up"
	defer func() { v.r.t.Logf("revive: round %d: %s", v.n, stage) }()
	q := fmt.Sprintf("rv-%d", v.n)
	if v.c.Queue(q).Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}) != nil {
		return
	}
	v.r.addQueue(q, history.QueueInfo{Deduped: true, Groups: []string{""}})
	item := func(part string, i int) queen.Item {
		tx := fmt.Sprintf("%s/%s/%d", q, part, i)
		return queen.Item{Partition: part, TransactionID: tx, Data: payload(q, tx)}
	}
	filler := func(i int) string { return fmt.Sprintf("f%02d", i) }
	// The rows to hold exist before the window.
	held := []string{"a"}
	for i := range rvLocked {
		held = append(held, filler(i))
	}
	var setup []queen.Item
	for _, p := range held {
		setup = append(setup, item(p, 0))
	}
	if res, err := v.push(ctx, q, setup); err != nil || !allStatus(res, queen.Queued) {
		stage = "setup push not queued"
		return
	}
	v.r.maintMu.RLock()
	defer v.r.maintMu.RUnlock() // after the deferred SetMaintenance(false) below
	fault := v.r.rec.Invoke(history.Event{Proc: rvProc, Op: history.OpFault, Kind: "maintenance"})
	v.r.faults.Add(1)
	on := false
	defer func() {
		for deadline := time.Now().Add(30 * time.Second); on && time.Now().Before(deadline); {
			if err := v.c.SetMaintenance(context.Background(), false); err == nil {
				on = false
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		v.r.rec.Done(fault, history.OK, history.Event{})
	}()
	setMaint := func(want bool) bool {
		if v.c.SetMaintenance(ctx, want) != nil {
			return false
		}
		on = want
		return true
	}
	if !setMaint(true) {
		return
	}
	// Spooled in this order, one chunk: a, the fillers (in any order: a
	// push spools its partitions in no set order), x's first record; then
	// x's second, the next chunk.
	var fill []queen.Item
	for i := range rvFillers {
		for j := range (rvChunk - 2 - i + rvFillers - 1) / rvFillers {
			fill = append(fill, item(filler(i), j+1))
		}
	}
	if len(fill)+2 != rvChunk {
		panic(fmt.Sprintf("revive: chunk of %d records", len(fill)+2))
	}
	for _, its := range [][]queen.Item{{item("a", 1)}, fill, {item("x", 0)}, {item("x", 1)}} {
		res, err := v.push(ctx, q, its)
		if err != nil {
			stage = fmt.Sprintf("a push failed: %v", err)
			return
		}
		if !allStatus(res, queen.Buffered) {
			stage = fmt.Sprintf("a push not buffered (%s): maintenance ended meanwhile", res[0].Status)
			return
		}
	}
	aPid, releaseA := v.holdRows(ctx, q, held[:1])
	defer releaseA()
	fPid, releaseF := v.holdRows(ctx, q, held[1:])
	defer releaseF()
	if aPid == 0 || fPid == 0 {
		stage = "rows not held"
		return
	}
	if !setMaint(false) {
		stage = "maintenance not ended"
		return
	}
	mon, err := pgx.Connect(ctx, v.r.url())
	if err != nil {
		return
	}
	defer mon.Close(context.Background())
	// The drain's pass: every worker's first call waits on a held row, a's
	// on its own or in a bundle with a filler's.
	if !waitUntil(10*time.Second, func() bool {
		time.Sleep(10 * time.Millisecond)
		return waiters(ctx, mon, aPid) > 0
	}) && waiters(ctx, mon, fPid) == 0 {
		stage = "no replay waited"
		return
	}
	time.Sleep(200 * time.Millisecond)
	if !setMaint(true) {
		return
	}
	before := v.c.SpoolStats().PendingRecords
	releaseF()
	// The fillers' calls stored their records; the next calls fail at once.
	waitUntil(5*time.Second, func() bool { return v.c.SpoolStats().PendingRecords < before })
	for last := int64(-1); ; {
		p := v.c.SpoolStats().PendingRecords
		if p == last {
			break
		}
		last = p
		time.Sleep(300 * time.Millisecond)
	}
	if !setMaint(false) {
		stage = "maintenance not ended"
		return
	}
	releaseA()
	stage = "a released"
	v.done++
	if !waitUntil(20*time.Second, func() bool { return v.c.SpoolStats().PendingRecords == 0 }) {
		stage = "a released; not drained in 20 s"
	}
}
