package queen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen/alloc"
	"github.com/e03140bc/queen/dedup"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/stmt"
)

// MaxDeliverAhead is how far ahead Item.DeliverAt may be: a year. A later
// time is more likely a unit mistake than a plan, and a scheduled message
// holds its transaction id until it is due.
const MaxDeliverAhead = 365 * 24 * time.Hour

// schedule_items' statuses (the list in sqlschema/functions/schedule.sql).
const (
	scheduleQueued    = 0
	scheduleDuplicate = 1
	scheduleEncrypted = 2
	scheduleLanes     = 3
)

const (
	// defaultSchedulePoll is how often the mover looks for due messages
	// with nothing known to be due sooner: the backstop for schedules no
	// notification told this client of (PushTx of another process, a lost
	// NOTIFY).
	defaultSchedulePoll = time.Second
	// moveLimit is the most messages one move transaction appends, and
	// moveMaxBytes the most bytes of them (but for a larger first one):
	// a stream gathered for moveGatherMax fits one move up to 50,000 a
	// second.
	moveLimit    = 10000
	moveMaxBytes = 16 << 20
	// moveIdle is the least the mover waits after a move that moved
	// nothing: due messages it could not take are another mover's.
	moveIdle = 10 * time.Millisecond
	// moveGather is the least time from one move's start to the next
	// unless the first left a backlog: messages falling due in a stream
	// gather meanwhile, so a move appends many per partition in one
	// transaction rather than one each. A move costs a commit and a
	// segment per partition on top of its rows. A message due after a
	// quiet spell is moved at its time: this only spaces moves in a row.
	moveGather = 50 * time.Millisecond
	// moveGatherPerSegment lengthens the spacing after a move by this
	// much per segment it appended, up to moveGatherMax: a stream spread
	// over many partitions pays each segment's fixed cost (its row, hash
	// row and partition update) per move, and spacing the moves makes the
	// segments larger. A light stream touches few partitions a move and
	// keeps moveGather. The price is lateness under such a stream, so the
	// spacing stays short: a mover-only run (BENCHMARKS.md, "Scheduled
	// moves, one walk") cost about the same per message at 320 ms as at
	// the 50–150 ms before: the cost is per row, not per segment.
	moveGatherPerSegment = 2 * time.Millisecond
	moveGatherMax        = 200 * time.Millisecond
)

// anyScheduled reports whether an item has a DeliverAt: only then does
// Push read the clock or split the call.
func anyScheduled(items []Item) bool {
	for i := range items {
		if !items[i].DeliverAt.IsZero() {
			return true
		}
	}
	return false
}

// refuseScheduled fails a PushTx or Client.Tx call with a scheduled item.
func refuseScheduled(items []Item) error {
	if !anyScheduled(items) {
		return nil
	}
	now := time.Now()
	for i := range items {
		if items[i].DeliverAt.After(now) {
			return fmt.Errorf("queen: item %d: Item.DeliverAt is for Push only, not PushTx or Client.Tx", i)
		}
	}
	return nil
}

// pushScheduled is Push for a call with some DeliverAt: the items due
// later are scheduled, the rest pushed now.
func (q *Queue) pushScheduled(ctx context.Context, items []Item) ([]PushResult, error) {
	e := q.c.e
	if e.isClosed() {
		return nil, ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return nil, err
	}
	if err := checkItems(items); err != nil {
		return nil, err
	}
	now := time.Now()
	var later, soon []int
	for i := range items {
		d := items[i].DeliverAt
		if !d.After(now) {
			soon = append(soon, i)
			continue
		}
		if d.Sub(now) > MaxDeliverAhead {
			return nil, fmt.Errorf("%w: item %d: DeliverAt %s is more than MaxDeliverAhead (%s) ahead", ErrTooLarge, i,
				d.Format(time.RFC3339), MaxDeliverAhead)
		}
		later = append(later, i)
	}
	res := make([]PushResult, len(items))
	pick := func(idx []int) []Item {
		sub := make([]Item, len(idx))
		for k, i := range idx {
			sub[k] = items[i]
			sub[k].DeliverAt = time.Time{}
		}
		return sub
	}
	if len(later) > 0 {
		sub := pick(later)
		for k, i := range later {
			sub[k].DeliverAt = items[i].DeliverAt
		}
		r, err := q.schedule(ctx, sub)
		if err != nil {
			return nil, err
		}
		for k, i := range later {
			res[i] = r[k]
		}
	}
	if len(soon) > 0 {
		r, err := q.pushNow(ctx, pick(soon))
		if err != nil {
			return nil, err
		}
		for k, i := range soon {
			res[i] = r[k]
		}
	}
	return res, nil
}

// schedule holds items (each with a DeliverAt ahead) in the scheduled
// table. A database error fails the items, not the call: they are not
// spooled.
func (q *Queue) schedule(ctx context.Context, items []Item) ([]PushResult, error) {
	e := q.c.e
	for attempt := 0; ; attempt++ {
		b, err := q.prepareFor(ctx, items, false)
		if err != nil {
			if errors.Is(err, ErrClosed) || errors.Is(err, ErrEncryption) || ctx.Err() != nil {
				return nil, err
			}
			return failAll(make([]PushResult, len(items)), items, err), nil
		}
		retry, err := q.scheduleBatch(ctx, items, b)
		b.release()
		var unknown *unknownOutcome
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.As(err, &unknown):
			return nil, err
		case err != nil:
			return failAll(b.results, items, err), nil
		case retry && attempt < 2:
			// The queue's settings changed (encryption, lanes): read them
			// again and prepare the items anew.
			e.forgetMeta(q.c.tenant, q.name)
			continue
		case retry:
			return failAll(b.results, items, errors.New("the queue's settings kept changing")), nil
		}
		return b.results, nil
	}
}

// unknownOutcome: whether a scheduled item was stored is unknown (its
// commit was sent and not answered, and asking again did not tell).
type unknownOutcome struct{ err error }

func (u *unknownOutcome) Error() string {
	return "queen: schedule: whether the scheduled items were stored is unknown (their commit was not answered): " + u.err.Error()
}

func (u *unknownOutcome) Unwrap() error { return u.err }

// isPassedByMove reports schedule_items' SQLSTATE QN004: a move passed
// an item's due time while the call waited for it, and nothing was
// written.
func isPassedByMove(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "QN004"
}

// failAll fails every item with err.
func failAll(res []PushResult, items []Item, err error) []PushResult {
	err = fmt.Errorf("queen: schedule (scheduled items are not spooled): %w", err)
	for i := range res {
		res[i].Status, res[i].Err, res[i].Offset = Failed, err, -1
		if res[i].TransactionID == "" {
			res[i].TransactionID = items[i].TransactionID
		}
	}
	return res
}

// scheduleBatch sends b's items to schedule_items and fills their results.
// retry: nothing was written, the queue's settings are not those b was
// prepared with.
func (q *Queue) scheduleBatch(ctx context.Context, items []Item, b *pushBatch) (retry bool, err error) {
	e := q.c.e
	n := len(items)
	p := stmt.ScheduleParams{Queue: stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}}
	// leader[i] is the item whose verdict item i takes: itself, or the
	// first with its transaction id (in any partition: a scheduled
	// transaction id is unique in its queue).
	leader := make([]int, n)
	first := make(map[dedup.Hash]int, n)
	var idx []int
	var earliest time.Time
	for i := range b.slab {
		pi := &b.slab[i]
		if b.leaderOf != nil && b.leaderOf[i] >= 0 {
			leader[i] = b.leaderOf[i]
			continue
		}
		if l, ok := first[pi.hash]; ok {
			leader[i] = l
			continue
		}
		first[pi.hash], leader[i] = i, i
		var flags int32
		if pi.Flags&frame.FlagEncrypted != 0 {
			flags |= alloc.FlagEncrypted
		}
		if pi.Key != "" {
			flags |= alloc.FlagKeyed
		}
		due := items[i].DeliverAt
		if earliest.IsZero() || due.Before(earliest) {
			earliest = due
		}
		p.Partitions = append(p.Partitions, b.results[i].Partition)
		p.Due = append(p.Due, due)
		p.Hashes = append(p.Hashes, pi.hash[:])
		p.IDs = append(p.IDs, pi.ID)
		p.Flags = append(p.Flags, flags)
		p.Lanes = append(p.Lanes, pi.lanes)
		p.Blobs = append(p.Blobs, segment.Single(&pi.Frame))
		idx = append(idx, i)
	}
	// Each call bounded as every statement of the engine is: a write
	// waiting on a lock (on the Citus layout, a reference-table write
	// waiting for a node) fails the items after StatementTimeout, as an
	// outage does, instead of holding the Push until its caller gives up.
	// Failed must mean not stored, so the statement runs in a transaction
	// committed only once it answered: one that outlived the timeout is
	// never committed (a statement on its own can commit after its caller
	// stopped waiting). Only the commit's answer can be lost (unknown).
	schedule := func() (rows []stmt.ScheduleRow, unknown bool, err error) {
		sctx, cancel := context.WithTimeout(ctx, e.cfg.StatementTimeout)
		defer cancel()
		tx, err := e.pool.Begin(sctx)
		if err != nil {
			return nil, false, err
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = tx.Rollback(rctx) // after the commit, a no-op
			cancel()
		}()
		if rows, err = stmt.Schedule(sctx, e.sql, tx, p); err != nil {
			return nil, false, err
		}
		if err = tx.Commit(sctx); err != nil {
			var pgErr *pgconn.PgError
			return nil, !errors.As(err, &pgErr), err
		}
		return rows, false, nil
	}
	rows, unknown, err := schedule()
	// lost: an attempt's commit went unanswered. Until an attempt answers
	// with rows, what that commit stored is unknown: a later attempt's
	// error (or its news that the settings changed, which would prepare
	// the items again under new ids) says nothing about it.
	lost := unknown
	var askUntil time.Time
	for try := 0; err != nil && ctx.Err() == nil && (lost || isPassedByMove(err) && try < 3); try++ {
		if lost {
			// Ask again, for up to twice StatementTimeout, until the
			// database tells (the call is idempotent by transaction id:
			// what the lost commit stored comes back as a duplicate of
			// its own id).
			if askUntil.IsZero() {
				askUntil = time.Now().Add(2 * e.cfg.StatementTimeout)
			} else if time.Now().After(askUntil) {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(min(50*time.Millisecond<<min(try, 5), time.Second)):
			}
			if ctx.Err() != nil {
				break
			}
		}
		// A move passed an item while the call waited for it; nothing was
		// written. Called again, the call takes the lock that lets it
		// write such items (see schedule_items).
		rows, unknown, err = schedule()
		lost = lost || unknown
	}
	changed := err == nil && len(rows) == 1 && rows[0].Ord == 0 &&
		(rows[0].Status == scheduleEncrypted || rows[0].Status == scheduleLanes)
	switch {
	case lost && (err != nil || changed):
		// Neither Scheduled nor Failed can be said: the call fails.
		if err == nil {
			err = errors.New("the queue's settings changed while its commit's outcome was asked again")
		}
		return false, &unknownOutcome{err}
	case err != nil:
		return false, err
	case changed:
		return true, nil
	}
	if len(rows) != len(idx) {
		return false, fmt.Errorf("schedule_items returned %d rows for %d items", len(rows), len(idx))
	}
	for _, r := range rows {
		i := idx[r.Ord-1]
		res := &b.results[i]
		switch r.Status {
		case scheduleQueued:
			res.Status = Scheduled
		case scheduleDuplicate:
			if r.DupID != nil && *r.DupID == b.slab[i].ID {
				// Stored by this call's own earlier attempt, whose commit's
				// answer was lost.
				res.Status = Scheduled
				break
			}
			res.Status = Duplicate
			res.MessageID = uuid.Nil
			if r.DupID != nil {
				res.MessageID = *r.DupID
			}
		default:
			return false, fmt.Errorf("schedule_items: unknown status %d", r.Status)
		}
	}
	for i, l := range leader {
		if l == i {
			continue
		}
		res, lr := &b.results[i], &b.results[l]
		res.Status, res.MessageID = Duplicate, lr.MessageID
	}
	e.mover.note(earliest)
	e.wake.Scheduled(earliest)
	return false, nil
}

// CancelScheduled deletes the queue's scheduled messages (pushed with an
// Item.DeliverAt) with these transaction ids that are not yet due and
// moved, and returns how many it deleted. A message being moved as this
// runs is waited for: it is then delivered and not counted, so each
// message is either cancelled (counted) or delivered, never both.
// Transaction ids not scheduled are skipped, and so is a failed message's
// copy waiting its retry backoff under FailureSkip (it is a retry, not a
// schedule; QueueStatus.RetriesWaiting counts it), unless it is held: a
// plaintext copy of a queue made encrypted during its wait, which only a
// cancel removes.
func (q *Queue) CancelScheduled(ctx context.Context, txnIDs []string) (int, error) {
	e := q.c.e
	if e.isClosed() {
		return 0, ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return 0, err
	}
	hashes := make([][]byte, len(txnIDs))
	for i, t := range txnIDs {
		if t == "" {
			return 0, fmt.Errorf("%w: transaction id %d is empty", ErrInvalidName, i)
		}
		if err := checkName(nameTransactionID, t); err != nil {
			return 0, fmt.Errorf("transaction id %d: %w", i, err)
		}
		h := dedup.Sum(t)
		hashes[i] = h[:]
	}
	if len(hashes) == 0 {
		return 0, nil
	}
	n, err := stmt.CancelScheduled(ctx, e.sql, e.pool, stmt.QueueRef{Tenant: q.c.tenant, Name: q.name}, hashes)
	if err != nil {
		return 0, fmt.Errorf("queen: cancel scheduled of %q: %w", q.name, err)
	}
	return int(n), nil
}

// mover appends due scheduled messages to their partitions: one goroutine
// per client, asleep until the earliest due time it knows of (from its
// last move, from this client's schedules, from other processes'
// notifications) or the poll interval.
type mover struct {
	e      *engine
	poll   time.Duration
	ctx    context.Context
	cancel context.CancelFunc
	kick   chan struct{}
	done   chan struct{}

	mu   sync.Mutex
	next time.Time // when to move next
}

func newMover(e *engine, poll time.Duration) *mover {
	m := &mover{e: e, poll: poll, kick: make(chan struct{}, 1), done: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(e.ctx)
	go m.run()
	return m
}

// note tells the mover that a message is due at due (zero: look now).
func (m *mover) note(due time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	sooner := due.Before(m.next)
	if sooner {
		m.next = due
	}
	m.mu.Unlock()
	if sooner {
		select {
		case m.kick <- struct{}{}:
		default:
		}
	}
}

// close stops the mover, cutting a move in flight short (its transaction
// rolls back: the messages stay scheduled), and waits for it within ctx.
func (m *mover) close(ctx context.Context) error {
	m.cancel()
	select {
	case <-m.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("queen: stop scheduled mover: %w", ctx.Err())
	}
}

func (m *mover) run() {
	defer close(m.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		m.mu.Lock()
		wait := time.Until(m.next)
		m.mu.Unlock()
		if wait > 0 {
			t.Reset(wait)
			select {
			case <-m.ctx.Done():
				return
			case <-m.kick:
				t.Stop()
				continue
			case <-t.C:
			}
		}
		if m.ctx.Err() != nil {
			return
		}
		start := time.Now()
		m.mu.Lock()
		// Notes during the move lower this; the move's answer may too.
		m.next = start.Add(m.poll)
		m.mu.Unlock()
		at := m.moveDue(start)
		m.mu.Lock()
		if at.Before(m.next) {
			m.next = at
		}
		m.mu.Unlock()
	}
}

// moveDue moves due messages until none is left that it can take, and
// returns when to look next.
func (m *mover) moveDue(start time.Time) time.Time {
	e := m.e
	if e.maintOn.Load() {
		// The database is in maintenance: pushes are spooled; moves wait.
		return start.Add(m.poll)
	}
	for {
		began := time.Now()
		ctx, cancel := context.WithTimeout(m.ctx, e.cfg.StatementTimeout)
		r, err := stmt.MoveScheduled(ctx, e.sql, e.pool, moveLimit, moveMaxBytes)
		cancel()
		if err != nil {
			if m.ctx.Err() == nil {
				e.log.Warn("queen: move scheduled messages", "err", err)
			}
			return time.Now().Add(m.poll)
		}
		m.wakeMoved(&r)
		if at, again := moveAfter(&r, began, time.Now(), m.poll); !again {
			return at
		}
	}
}

// moveAfter is when to move next after a move that began at began and
// answered r at now. again: at once, as the move left a backlog (messages
// due before it began: it met its limits). Otherwise the next due time,
// but no sooner than moveGather after a move that took some (so a stream
// gathers; longer after one that appended many segments, see
// moveGatherPerSegment) and no later than the poll.
func moveAfter(r *stmt.MoveRow, began, now time.Time, poll time.Duration) (at time.Time, again bool) {
	if r.NextIn == nil {
		return now.Add(poll), false
	}
	took := r.Moved + r.Dropped + r.Held
	wait := time.Duration(*r.NextIn) * time.Millisecond
	switch {
	case took > 0 && now.Add(wait).Before(began):
		return now, true
	case took == 0 && wait <= 0:
		// Due but not taken: another mover holds them.
		wait = moveIdle
	}
	at = now.Add(max(wait, 0))
	if took > 0 {
		gather := min(max(time.Duration(len(r.WokeParts))*moveGatherPerSegment, moveGather), moveGatherMax)
		at = later(at, began.Add(gather))
	}
	return earlier(at, now.Add(poll)), false
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// wakeMoved tells consumers of the partitions a move appended to.
func (m *mover) wakeMoved(r *stmt.MoveRow) {
	type part struct {
		tenant           [16]byte
		queue, partition string
	}
	seen := make(map[part]bool, len(r.WokeParts))
	for i := range r.WokeParts {
		k := part{r.WokeTenants[i], r.WokeQueues[i], r.WokeParts[i]}
		if seen[k] {
			continue
		}
		seen[k] = true
		m.e.wake.Pushed(r.WokeTenants[i], r.WokeQueues[i], r.WokeParts[i])
	}
}
