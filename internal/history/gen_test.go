package history_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/zeebo/xxh3"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// genKinds are the generators beyond the base operations (push, PushTx,
// Client.Tx, pop and settle, AckBatch, Consume, Maintain, Configure and
// the nemesis's faults). Each can be switched off to isolate a violation:
// -gen=pause,texts (or $QUEEN_HISTORY_GEN) runs only those; "none" runs
// the base operations alone.
var genKinds = []string{
	"txconsume", // Client.Tx and PushTx inside Consume handlers, with and without KeyConcurrency
	"lanes",     // Lanes changed under a client's cached count, keyed pushes repeating transaction ids
	"keyrot",    // a client rotating to a new key mid-run
	"wrongkey",  // consumers of the encrypted queue with a wrong key and with none
	"texts",     // NUL, invalid UTF-8 and oversize text in every call that takes one
	"pause",     // Pause and Resume
	"requeue",   // DeadLetters then RequeueDeadLetters
	"peek",      // Peek
	"delete",    // Queue.Delete of the "doomed" queue
	"softstop",  // ConsumeOptions.SoftStop
	"timeout",   // ConsumeOptions.HandlerTimeout with handlers that outlive it
	"panic",     // panicking handlers
	"firstpush", // the first push to an unseen queue during an outage, with and without a key
	"keyedtx",   // two transactions making first keyed pushes to two fresh queues in opposite orders
	"scribble",  // handlers and consumers writing over Message.Data before they fail or dead-letter it
	"status",    // Queue.Status, its lag judged against its own offsets
	"autoack",   // Consume with AutoAck (group g2), its claims judged from its log
	"contact",   // a SubscribeNew first contact held open while another group's pop empties a partition it was seeded past
	"autostop",  // an AutoAck Consume with KeyConcurrency stopped mid-batch on a queue of its own
	"autoorder", // a deep one-partition backlog drained by one AutoAck Consume of several workers and small batches (gen_autoorder_test.go)
	"stall",     // a Consume whose client cannot reach the database past its lease, mid-batch, while another takes the batch over
	"freeze",    // a Consume frozen between deciding to run a handler and its start (a tracer's span start) past the lease, while another takes the batch over
	"metrics",   // a client's consume-side counters against its history (Consume handlers acking in Client.Tx)
	"dashboard", // queenui's replay and replay-all driven over HTTP
	"fromedge",  // a SubscribeFrom time taken while a push waits for its partition's row
	"faults",    // segments rewritten under their keys, a poison spool record, an idle-partition purge (gen_faults_test.go)
	"spoolwin",  // in maintenance windows: pushes spooled behind, by a client missing or holding stale settings, across a lane-count change
	"revive",    // a spool replay pass halted by failures in a row while a call still waits on a row, which then succeeds (gen_revive_test.go)
	"staleflag", // a client's maintenance-flag re-read held (a tracer on its own pool) across its SetMaintenance(true), then pushes (gen_maintstale_test.go)
	"misuse",    // nil messages settled, bad URLs, sub-ms leases, unsafe spool dirs, a dead server, Close with a short deadline; odd seeds' schema 63 bytes
	"seedrows",  // a subscribed group's pop seeding its first cursor rows on new partitions while retention_step runs on them (gen_seedrows_test.go)
	"sched",     // Item.DeliverAt 0.2-3 s ahead (some past, some repeats) and CancelScheduled of one id a call (gen_sched_test.go)
	"retrywait", // failures on a queue with a RetryBackoff, by its schedule or with queen.RetryAfter / Message.RetryAfter waits
	"discard",   // DiscardDeadLetters of one listed dead letter by id, then listing it again
	"offsets",   // ResetGroup, DeleteGroup and ReleaseLease by an operator beside Pop and Consume readers of the groups (gen_offsets_test.go)
	"keyback",   // failures under a 5 s RetryBackoff with KeyConcurrency (other keys of the lane) and FailureSkip (gen_keyback_test.go)
	"storm",     // nemesis: every maintenance step in a tight loop beside first contacts and claims, and all run long first cursor rows racing retention_step
}

// genOpen are kinds left out by default (run them with -gen=all or by
// name): an "autoack" Consume's stop cancels a claim in flight without
// logging it, and one that committed took its batch unseen (at-most-once
// allows it), which the check cannot excuse.
var genOpen = []string{"autoack"}

var flagGen = flag.String("gen", "", "history: generator kinds, comma-separated (default all"+genOpenHelp()+"; all; none: base operations only; or $QUEEN_HISTORY_GEN)")

func genOpenHelp() string {
	if len(genOpen) == 0 {
		return ""
	}
	return " but " + strings.Join(genOpen, ",")
}

type gens map[string]bool

func parseGens(s string) (gens, error) {
	if s == "" {
		s = os.Getenv("QUEEN_HISTORY_GEN")
	}
	g := gens{}
	if s == "" || s == "all" {
		for _, k := range genKinds {
			if s == "all" || !slices.Contains(genOpen, k) {
				g[k] = true
			}
		}
		return g, nil
	}
	if s == "none" {
		return g, nil
	}
	for _, k := range strings.Split(s, ",") {
		if !slices.Contains(genKinds, k) {
			return nil, fmt.Errorf("unknown generator %q (have %s)", k, strings.Join(genKinds, ","))
		}
		g[k] = true
	}
	return g, nil
}

func (g gens) String() string {
	var ks []string
	for k := range g {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	if len(ks) == 0 {
		return "none"
	}
	return strings.Join(ks, ",")
}

// extra runs one of the worker-level generators that are on.
func (w *worker) extra(ctx context.Context) {
	var on []string
	for _, k := range []string{"texts", "pause", "requeue", "peek", "delete", "lanes", "keyedtx", "status"} {
		if w.gen[k] && (k != "lanes" && k != "keyedtx" || w.r != nil) && (k != "delete" || w.idx == 0) {
			on = append(on, k)
		}
	}
	if len(on) == 0 {
		return
	}
	k := on[w.rng.IntN(len(on))]
	if w.gen["requeue"] && w.rng.IntN(len(on)) == 0 {
		k = "requeue" // twice as often: it needs dead letters, which come late
	}
	switch k {
	case "texts":
		w.invalid(ctx)
	case "pause":
		w.pause(ctx)
	case "requeue":
		w.requeue(ctx)
	case "peek":
		w.peek(ctx)
	case "delete":
		w.deleteDoomed(ctx)
	case "lanes":
		w.lanes(ctx)
	case "keyedtx":
		w.keyedTx(ctx)
	case "status":
		w.status(ctx)
	}
}

// allGroups are the groups every audited queue of the spec list is read by.
func allGroups() []string {
	return append(append(slices.Clone(groups), lateGroups...), fromGroup)
}

func (w *worker) call(q, group, kind string, invalid bool) history.Event {
	return w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: kind, Queue: q, Group: group, Invalid: invalid})
}

// done completes a call: ok on nil, fail when err is want (the certain,
// documented refusal), info else.
func (w *worker) done(inv history.Event, err, want error) {
	switch {
	case err == nil:
		w.rec.Done(inv, history.OK, history.Event{})
	case want != nil && errors.Is(err, want):
		w.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
	default:
		w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
	}
}

// pause pauses a group of a queue for a moment, then resumes it.
func (w *worker) pause(ctx context.Context) {
	q := w.queue()
	if q == "doomed" {
		return
	}
	gs := allGroups()
	g := gs[w.rng.IntN(len(gs))]
	inv := w.call(q, g, "pause", false)
	w.done(inv, w.c.Queue(q).Pause(ctx, g), nil)
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(100+w.rng.IntN(300)) * time.Millisecond):
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	inv = w.call(q, g, "resume", false)
	w.done(inv, w.c.Queue(q).Resume(rctx, g), nil)
}

// requeue lists a page of a group's dead letters and requeues exactly those.
func (w *worker) requeue(ctx context.Context) {
	q := w.queue()
	// The group of a dead letter the queue has (most groups have none most
	// of the run), then a page of that group's.
	some, err := w.c.Queue(q).DeadLetters(ctx, queen.DeadLetterQuery{Limit: 50})
	if err != nil || len(some) == 0 {
		return
	}
	g := some[w.rng.IntN(len(some))].Group
	dls, err := w.c.Queue(q).DeadLetters(ctx, queen.DeadLetterQuery{Groups: []string{g}, Limit: 1 + w.rng.IntN(20)})
	if err != nil || len(dls) == 0 {
		return
	}
	var ids []int64
	for _, d := range dls {
		ids = append(ids, d.ID)
	}
	rq := queen.DeadLetterQuery{Groups: []string{g}, IDs: ids, Limit: len(ids)}
	if w.rng.IntN(2) == 0 {
		// Bounded as the dashboard's Replay all is, by one of the listed
		// ids below the highest: the ones above it must stay dead letters
		// (Kept).
		sorted := slices.Sorted(slices.Values(ids))
		rq.MaxID = sorted[w.rng.IntN(max(len(sorted)-1, 1))]
	}
	var ms, kept []history.Delivery
	for _, d := range dls {
		hd := history.Delivery{Partition: d.Partition, Offset: d.Offset, ID: d.MessageID.String(), TxID: d.TransactionID}
		if rq.MaxID > 0 && d.ID > rq.MaxID {
			kept = append(kept, hd)
		} else {
			ms = append(ms, hd)
		}
	}
	inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "requeue", Queue: q, Group: g, Msgs: ms, Kept: kept})
	_, err = w.c.Queue(q).RequeueDeadLetters(ctx, rq)
	w.done(inv, err, nil)
}

// peek reads a queue without leasing; what it read is recorded.
func (w *worker) peek(ctx context.Context) {
	q := w.queue()
	o := queen.PeekOptions{Limit: 1 + w.rng.IntN(50), From: int64(w.rng.IntN(3))}
	if w.rng.IntN(2) == 0 {
		o.Partition = fmt.Sprintf("s%d", w.rng.IntN(smallKeys))
	}
	inv := w.call(q, "", "peek", false)
	msgs, err := w.c.Queue(q).Peek(ctx, o)
	if err != nil {
		w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return
	}
	ds := make([]history.Delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = delivery(m)
	}
	w.rec.Done(inv, history.OK, history.Event{Msgs: ds})
}

// deleteDoomed deletes the "doomed" queue and configures it again at once
// (a push racing in between recreates it with the defaults).
func (w *worker) deleteDoomed(ctx context.Context) {
	if w.rng.IntN(2) == 0 {
		w.deleteRace(ctx)
		return
	}
	inv := w.call("doomed", "", "delete", false)
	w.done(inv, w.c.Queue("doomed").Delete(ctx), nil)
	_ = w.c.Queue("doomed").Configure(context.WithoutCancel(ctx), w.options("doomed"))
}

func laneOf(key string, lanes int) string {
	return "lane-" + strconv.FormatUint(xxh3.HashString(key)%uint64(lanes), 10)
}

// lanePair returns two keys that share a lane under a lanes and not under
// b (b must not divide a).
func lanePair(j, a, b int) (string, string) {
	k := fmt.Sprintf("pair%d-0", j)
	for n := 1; n < 1<<20; n++ {
		o := fmt.Sprintf("pair%d-%d", j, n)
		if laneOf(o, a) == laneOf(k, a) && laneOf(o, b) != laneOf(k, b) {
			return k, o
		}
	}
	panic("no lane pair")
}

// lanes changes a fresh queue's lane count while this client caches the
// old one, then pushes keyed items repeating transaction ids (within a
// call and across calls), and pairs of one id whose keys share a lane only
// under the old count (one call's leader and follower, whose lanes part
// once the database sends the call back to be routed again); once keyed
// messages are stored another count must fail with ErrLanesFixed.
func (w *worker) lanes(ctx context.Context) {
	w.n++
	q := fmt.Sprintf("lanes-%s.%d-%d", w.proc, w.idx, w.n)
	w.r.addQueue(q, history.QueueInfo{Deduped: true, Groups: []string{""}, DeadLetter: true})
	counts := []int{2, 3, 4, 8, 64}
	a := counts[w.rng.IntN(len(counts))]
	b := counts[w.rng.IntN(len(counts))]
	for b == a {
		b = counts[w.rng.IntN(len(counts))]
	}
	opts := func(n int) queen.QueueOptions {
		return queen.QueueOptions{DedupWindow: time.Hour, RetryLimit: 2, DeadLetter: true, LeaseTime: time.Second, Lanes: n}
	}
	if err := w.other.Queue(q).Configure(ctx, opts(a)); err != nil {
		return
	}
	tx := func(i int) string { return fmt.Sprintf("%s/%d", q, i) }
	queued := false // a keyed item is surely stored: the count is fixed
	push := func(items []queen.Item, lanes int) {
		hs := histItems(items)
		for i, it := range items {
			if it.Key != "" && it.Partition == "" {
				hs[i].Partition = laneOf(it.Key, lanes)
			}
		}
		inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Queue: q, Items: hs})
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		res, err := w.c.Queue(q).Push(pctx, items)
		if err != nil {
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
			return
		}
		w.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
		for i, r := range res {
			queued = queued || (items[i].Key != "" && r.Status == queen.Queued)
		}
	}
	// This client reads the count a.
	push([]queen.Item{{Partition: "p", TransactionID: tx(0), Data: payload(q, tx(0))}}, a)
	if err := w.other.Queue(q).Configure(ctx, opts(b)); err != nil {
		return
	}
	keyed := func(ids ...int) []queen.Item {
		var items []queen.Item
		for _, i := range ids {
			items = append(items, queen.Item{TransactionID: tx(i), Key: fmt.Sprintf("key%d", i%5), Data: payload(q, tx(i))})
		}
		return items
	}
	first := keyed(1, 2, 1, 3, 2, 4)
	if a%b != 0 {
		for j := range 2 {
			ka, kb := lanePair(j, a, b)
			t := tx(100 + j)
			first = append(first, queen.Item{TransactionID: t, Key: ka, Data: payload(q, t)}, queen.Item{TransactionID: t, Key: kb, Data: payload(q, t)})
		}
	}
	push(first, b)
	push(keyed(1, 5, 3, 6, 5), b)
	if !queued {
		return // spooled: the count may still change
	}
	inv := w.call(q, "", "configure-lanes", true)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := w.other.Queue(q).Configure(cctx, opts(a))
	if err != nil && !errors.Is(err, queen.ErrLanesFixed) && !errors.Is(err, queen.ErrInvalidName) {
		// The database could not answer (a fault): the count is unchanged.
		w.rec.Done(inv, history.Fail, history.Event{Err: "unanswered: " + err.Error()})
		return
	}
	w.done(inv, err, queen.ErrLanesFixed)
}

// status reads a queue's Status and records each group's row (cursor,
// settled count, lag) of a few partitions, and every row where lag is more
// than the tail less the cursor: settled offsets above the cursor, or a
// retention cut past it. On the Retention queue it first pops as a group
// nobody else reads ("lagger", not recorded: no check owes it anything),
// whose cursors retention then overtakes.
func (w *worker) status(ctx context.Context) {
	q := w.queue()
	if w.rng.IntN(3) == 0 {
		q = "retained"
	}
	if q == "retained" {
		_, _ = w.c.Queue(q).Pop(ctx, queen.PopOptions{Group: "lagger", Batch: 1, Partitions: 8, AutoAck: true})
	}
	st, err := w.c.Queue(q).Status(ctx)
	if err != nil {
		return
	}
	for i, p := range st.Partitions {
		for _, g := range p.Groups {
			if i >= 16 && g.Settled == 0 && g.Committed >= p.LogStart-1 {
				continue
			}
			inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpCall, Kind: "status", Queue: q, Group: g.Group, Partition: p.Name,
				Lag: &history.LagRead{LastOffset: p.LastOffset, LogStart: p.LogStart, Committed: g.Committed, Settled: g.Settled, Lag: g.Lag}})
			w.rec.Done(inv, history.OK, history.Event{})
		}
	}
}

// keyedTx makes two fresh queues, then two transactions that each PushTx
// keyed items to one of them, wait for the other to have done the same, and
// PushTx to the other queue: first keyed pushes in opposite orders, which
// must not deadlock (each marks its queue keyed ahead, outside the
// transaction; each side pushes to partitions of its own).
func (w *worker) keyedTx(ctx context.Context) {
	w.n++
	qs := [2]string{}
	for i := range qs {
		qs[i] = fmt.Sprintf("kt-%s.%d-%d-%d", w.proc, w.idx, w.n, i)
		w.r.addQueue(qs[i], history.QueueInfo{Deduped: true, Groups: []string{""}})
		if err := w.c.Queue(qs[i]).Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, LeaseTime: time.Second}); err != nil {
			return
		}
	}
	items := func(q string, j int) []queen.Item {
		var out []queen.Item
		for i := range 3 {
			tx := fmt.Sprintf("%s/%d.%d", q, j, i)
			// A partition of each side's own: only the queue rows are shared.
			out = append(out, queen.Item{Partition: fmt.Sprintf("t%d", j), Key: fmt.Sprintf("key%d", i), TransactionID: tx, Data: payload(q, tx)})
		}
		return out
	}
	// Both pushes of one side are recorded before its transaction begins,
	// as pushTx does: a Begin that fails leaves them failed.
	var firsts [2]chan struct{}
	for i := range firsts {
		firsts[i] = make(chan struct{})
	}
	var wg sync.WaitGroup
	for side := range 2 {
		order := [2]string{qs[side], qs[1-side]}
		wg.Go(func() {
			var once sync.Once
			first := func() { once.Do(func() { close(firsts[side]) }) }
			defer first()
			var invs [2]history.Event
			var its [2][]queen.Item
			for i, q := range order {
				its[i] = items(q, side)
				invs[i] = w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Kind: "pushtx", Queue: q, Items: histItems(its[i])})
			}
			failAll := func(from int, phase string, err error) {
				for i := from; i < 2; i++ {
					w.rec.Done(invs[i], phase, history.Event{Err: errText(err)})
				}
			}
			tx, err := w.c.Pool().Begin(ctx)
			if err != nil {
				failAll(0, history.Fail, err)
				return
			}
			defer tx.Rollback(context.Background())
			var res [2][]queen.PushResult
			for i, q := range order {
				if res[i], err = w.c.Queue(q).PushTx(ctx, tx, its[i]); err != nil {
					failAll(0, history.Fail, err)
					return
				}
				if i == 0 {
					first()
					select { // the other side's first push is made (or failed)
					case <-firsts[1-side]:
					case <-time.After(3 * time.Second):
					}
				}
			}
			if err := tx.Commit(ctx); err != nil {
				failAll(0, history.Info, err)
				return
			}
			for i := range invs {
				w.rec.Done(invs[i], history.OK, history.Event{Results: histResults(res[i])})
			}
		})
	}
	wg.Wait()
}

// badTexts are names, keys and values no call may take.
var badTexts = []string{"nul\x00in", "bad\xffutf8", "\xc3", strings.Repeat("n", queen.MaxNameLen+1), "ctl\x01", "tab\tname"}

// badReason is a reason (an error text) PostgreSQL text cannot hold as is.
func badReason(rng *rand.Rand) error {
	switch rng.IntN(4) {
	case 0:
		return errors.New("history: nul\x00reason")
	case 1:
		return errors.New("history: bad\xff\xfeutf8 reason")
	case 2:
		return errors.New("history: " + strings.Repeat("long é ", queen.MaxReasonLen/7+10))
	}
	return errors.New("history: nul\x00 and bad\xff and long " + strings.Repeat("x", queen.MaxReasonLen))
}

// reason is a settlement's reason: sometimes a bad text when "texts" is on.
func (w *worker) reason(def string) error {
	if w.gen["texts"] && w.rng.IntN(3) == 0 {
		return badReason(w.rng)
	}
	return errors.New(def)
}

// invalid makes one call with input it must refuse, and records it.
func (w *worker) invalid(ctx context.Context) {
	// The run's end must not cut a call short: its refusal is the point.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	q := w.queue()
	bad := badTexts[w.rng.IntN(len(badTexts))]
	// A bad name for a queue, partition or group: control characters count.
	badName := bad
	w.n++
	tx := w.proc + "." + strconv.Itoa(w.idx) + "/bad/" + strconv.Itoa(w.n)
	good := queen.Item{Partition: "s0", TransactionID: tx + "/0", Data: payload(q, tx+"/0")}
	item := queen.Item{Partition: "s0", TransactionID: tx + "/1", Data: payload(q, tx+"/1")}
	want := queen.ErrInvalidName
	switch w.rng.IntN(6) {
	case 0:
		if bad == "tab\tname" || bad == "ctl\x01" {
			item.Key = bad + "\x00" // control characters are fine in a key, NUL is not
		} else {
			item.Key = bad
		}
	case 1:
		item.Headers = map[string]string{"h": "v", "x-bad": bad}
		if bad == "tab\tname" || bad == "ctl\x01" || len(bad) > queen.MaxNameLen {
			item.Headers["x-bad"] = "\x00"
		}
	case 2:
		item.Headers = map[string]string{bad: "v"}
		if bad == "tab\tname" || bad == "ctl\x01" || len(bad) > queen.MaxNameLen {
			item.Headers = map[string]string{"": "v"}
		}
	case 3:
		item.Headers = map[string]string{"big": strings.Repeat("v", queen.MaxHeadersSize)}
		want = queen.ErrTooLarge
	case 4:
		item.Partition = badName
	case 5:
		if len(bad) > queen.MaxNameLen {
			item.TransactionID = strings.Repeat("t", queen.MaxTransactionIDLen+1)
			want = queen.ErrTooLarge
		} else if bad == "tab\tname" || bad == "ctl\x01" {
			item.TransactionID = "nul\x00tx"
		} else {
			item.TransactionID = bad
		}
	}
	items := []queen.Item{good, item}
	switch x := w.rng.IntN(100); {
	case x < 30:
		w.invalidPush(ctx, q, "", items, want)
	case x < 38:
		w.invalidPush(ctx, badName, "", []queen.Item{good}, queen.ErrInvalidName)
	case x < 45:
		w.invalidPush(ctx, q, "pushtx", items, want)
	case x < 52:
		w.invalidPush(ctx, q, "tx", items, want)
	case x < 58:
		inv := w.call(q, badName, "pop", true)
		_, err := w.c.Queue(q).Pop(ctx, queen.PopOptions{Group: badName})
		w.done(inv, err, queen.ErrInvalidName)
	case x < 62:
		inv := w.call(q, "", "pop-partition", true)
		_, err := w.c.Queue(q).Pop(ctx, queen.PopOptions{Partition: badName})
		w.done(inv, err, queen.ErrInvalidName)
	case x < 66:
		inv := w.call(q, badName, "consume", true)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := w.c.Queue(q).Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: badName}}, func(context.Context, *queen.Message) error { return nil })
		cancel()
		if err == nil {
			err = errors.New("Consume ran")
		}
		w.done(inv, err, queen.ErrInvalidName)
	case x < 70:
		inv := w.call(q, "", "peek", true)
		_, err := w.c.Queue(q).Peek(ctx, queen.PeekOptions{Partition: badName})
		w.done(inv, err, queen.ErrInvalidName)
	case x < 74:
		inv := w.call(q, badName, "pause", true)
		w.done(inv, w.c.Queue(q).Pause(ctx, badName), queen.ErrInvalidName)
	case x < 77:
		inv := w.call(q, badName, "resume", true)
		w.done(inv, w.c.Queue(q).Resume(ctx, badName), queen.ErrInvalidName)
	case x < 82:
		inv := w.call(q, badName, "deadletters", true)
		o := queen.DeadLetterQuery{Groups: []string{badName}}
		if w.rng.IntN(2) == 0 {
			o = queen.DeadLetterQuery{Partition: badName}
		}
		_, err := w.c.Queue(q).DeadLetters(ctx, o)
		w.done(inv, err, queen.ErrInvalidName)
	case x < 87:
		inv := w.call(q, badName, "requeue", true)
		o := queen.DeadLetterQuery{Groups: []string{badName}}
		if w.rng.IntN(2) == 0 {
			o = queen.DeadLetterQuery{Partition: badName}
		}
		_, err := w.c.Queue(q).RequeueDeadLetters(ctx, o)
		w.done(inv, err, queen.ErrInvalidName)
	default:
		name := badName
		if name == "" {
			name = "\x00"
		}
		var err error
		kind := []string{"configure", "delete", "status", "pause-queue"}[w.rng.IntN(4)]
		inv := w.call(name, "", kind, true)
		switch kind {
		case "configure":
			err = w.c.Queue(name).Configure(ctx, queen.QueueOptions{})
		case "delete":
			err = w.c.Queue(name).Delete(ctx)
		case "status":
			_, err = w.c.Queue(name).Status(ctx)
		case "pause-queue":
			err = w.c.Queue(name).Pause(ctx, "")
		}
		w.done(inv, err, queen.ErrInvalidName)
	}
}

// invalidPush pushes items one of which is invalid, by Push, PushTx or
// Client.Tx: the call must fail with want and store none of them.
func (w *worker) invalidPush(ctx context.Context, q, kind string, items []queen.Item, want error) {
	// PushTx is called, and recorded, only once the caller's transaction
	// began: a Begin failing in an outage never reached the call.
	var tx pgx.Tx
	if kind == "pushtx" {
		var err error
		if tx, err = w.c.Pool().Begin(ctx); err != nil {
			return
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
	}
	ev := history.Event{Proc: w.proc, Op: history.OpPush, Kind: kind, Queue: q, Items: histItems(items), Invalid: true}
	var inv history.Event
	if kind != "tx" {
		inv = w.rec.Invoke(ev)
	}
	var err error
	switch kind {
	case "":
		_, err = w.c.Queue(q).Push(ctx, items)
	case "pushtx":
		if _, err = w.c.Queue(q).PushTx(ctx, tx, items); err == nil {
			err = tx.Commit(ctx)
			if err == nil {
				err = errors.New("committed")
			}
		}
	case "tx":
		// Recorded once Client.Tx runs the function (its transaction
		// began): a Begin failing in an outage never reached tx.Push.
		called := false
		err = w.c.Tx(ctx, func(tx *queen.Tx) error {
			if !called {
				inv = w.rec.Invoke(ev)
			}
			called = true
			tx.Push(q, items)
			return nil
		})
		if !called {
			return
		}
	}
	w.done(inv, err, want)
}

// handlerTx is a Consume handler's body that acks (or, with KeyConcurrency,
// sometimes fails) its message and pushes in one Client.Tx, or pushes by
// PushTx in a transaction of its own. mu guards the worker's generator.
func (w *worker) handlerTx(ctx context.Context, m *queen.Message, keyed bool, mu *sync.Mutex) error {
	mu.Lock()
	dst := w.queue()
	items := w.items(dst)
	if len(items) > 20 {
		items = items[:20]
	}
	pushTx := w.rng.IntN(3) == 0
	fail := keyed && w.rng.IntN(4) == 0
	reason := w.reason("history: failed in a Tx on purpose")
	mu.Unlock()
	if pushTx {
		inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Kind: "pushtx", Queue: dst, Items: histItems(items)})
		tx, err := w.c.Pool().Begin(ctx)
		if err != nil {
			w.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
			return nil
		}
		defer tx.Rollback(context.Background())
		res, err := w.c.Queue(dst).PushTx(ctx, tx, items)
		if err != nil {
			w.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
			return nil
		}
		if err := tx.Commit(ctx); err != nil {
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
			return nil
		}
		w.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
		return nil
	}
	kind := "ack"
	if fail {
		kind = "fail"
	}
	se := settleEvent(w.proc, m, kind)
	se.Keyed = keyed
	sinv := w.rec.Invoke(se)
	pinv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Kind: "tx", Queue: dst, Items: histItems(items)})
	err := w.c.Tx(ctx, func(tx *queen.Tx) error {
		if fail {
			tx.Fail(m, reason)
		} else {
			tx.Ack(m)
		}
		tx.Push(dst, items)
		return nil
	})
	switch {
	case err == nil:
		w.rec.Done(sinv, history.OK, history.Event{})
		res := make([]history.Result, len(items))
		for i := range res {
			res[i] = history.Result{Status: "committed", Offset: -1}
		}
		w.rec.Done(pinv, history.OK, history.Event{Results: res})
		return nil
	case errors.Is(err, queen.ErrTxAborted), errors.Is(err, queen.ErrKeyedSettle):
		w.rec.Done(sinv, history.Fail, history.Event{Err: err.Error(), LeaseLost: errors.Is(err, queen.ErrLeaseLost)})
		w.rec.Done(pinv, history.Fail, history.Event{Err: err.Error()})
	default:
		w.rec.Done(sinv, history.Info, history.Event{Err: err.Error()})
		w.rec.Done(pinv, history.Info, history.Event{Err: err.Error()})
	}
	if fail {
		return reason // the Tx did not fail it: the handler does
	}
	return nil
}

// wrongKeyLoop consumes the encrypted queue with clients that cannot open
// it (a wrong key, no key): they must be delivered nothing, and must not
// dead-letter what they cannot read.
func (r *run) wrongKeyLoop(ctx context.Context, cs []*queen.Client, names []string, rng *rand.Rand) {
	gs := allGroups()
	for ctx.Err() == nil {
		i := rng.IntN(len(cs))
		c, proc := cs[i], names[i]
		g := gs[rng.IntN(len(gs))]
		q := c.Queue("secret")
		o := queen.PopOptions{Group: g, Batch: 1 + rng.IntN(10), Partitions: 1 + rng.IntN(4), LeaseTime: 300 * time.Millisecond}
		switch g {
		case fromGroup:
			o.Subscription = queen.SubscribeFrom(r.from)
		case lateGroups[0]:
			o.Subscription = queen.SubscribeNew
		}
		if rng.IntN(3) == 0 {
			cctx, cancel := context.WithTimeout(ctx, time.Duration(200+rng.IntN(500))*time.Millisecond)
			_ = q.Consume(cctx, queen.ConsumeOptions{PopOptions: o, KeyConcurrency: 1 + rng.IntN(2)}, func(_ context.Context, m *queen.Message) error {
				inv := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpHandler, Queue: "secret", Group: m.Group, Partition: m.Partition,
					Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}, WrongKey: true})
				r.rec.Done(inv, history.OK, history.Event{})
				return nil
			})
			cancel()
		} else {
			inv := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpPop, Queue: "secret", Group: g, Batch: o.Batch, WrongKey: true})
			msgs, err := q.Pop(ctx, o)
			if err != nil {
				r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
			} else {
				ds := make([]history.Delivery, len(msgs))
				for i, m := range msgs {
					ds[i] = delivery(m)
				}
				r.rec.Done(inv, history.OK, history.Event{Msgs: ds})
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(100+rng.IntN(300)) * time.Millisecond):
		}
	}
}

// firstPush pushes to a queue nobody has seen, during an outage: the push
// must be Buffered (or Queued), never an error.
func (r *run) firstPush(c *queen.Client, proc string) {
	n := r.fresh.Add(1)
	q := fmt.Sprintf("fresh-%d", n)
	r.addQueue(q, history.QueueInfo{Groups: []string{""}})
	items := []queen.Item{{Partition: "p", TransactionID: fmt.Sprintf("%s/0", q), Data: payload(q, q)}}
	inv := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpPush, Queue: q, Items: histItems(items)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.Queue(q).Push(ctx, items)
	if err != nil {
		r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return
	}
	r.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
}

// storm runs every maintenance step in a tight loop over the retained
// queues' partitions, beside first contacts of new groups and claims, for
// about d: races the background loop makes rare.
func (n *nemesis) storm(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	s := pgx.Identifier{n.r.schema}.Sanitize()
	var wg sync.WaitGroup
	steps := []string{
		fmt.Sprintf(`SELECT %s.retention_step($1, 1000)::bigint`, s),
		fmt.Sprintf(`SELECT %s.purge_txns_step($1, (SELECT greatest(q.dedup_window_ms, 600000) FROM %[1]s.partitions p JOIN %[1]s.queues q ON q.id = p.queue_id WHERE p.id = $1), 1000)::bigint`, s),
		fmt.Sprintf(`SELECT %s.purge_partition($1, 100)::int::bigint`, s),
	}
	for range 2 {
		wg.Go(func() {
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					conn.Close(context.Background())
				}
			}()
			for ctx.Err() == nil {
				if conn == nil {
					var err error
					if conn, err = pgx.Connect(ctx, n.r.url()); err != nil {
						time.Sleep(50 * time.Millisecond)
						continue
					}
				}
				var pids []int64
				rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT p.id FROM %[1]s.partitions p JOIN %[1]s.queues q ON q.id = p.queue_id
					WHERE q.name IN ('completed', 'retained') ORDER BY random()`, s))
				if err == nil {
					pids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
				}
				for _, pid := range pids {
					for _, st := range steps {
						var x int64
						if err = conn.QueryRow(ctx, st, pid).Scan(&x); err != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				if err != nil && ctx.Err() == nil {
					conn.Close(context.Background())
					conn = nil
				}
			}
		})
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			_, _ = n.admin.Maintain(ctx)
		}
	})
	// First contacts: new groups reading everything, and claims of the
	// others, on the CompletedRetention queue.
	c := n.clients[n.rng.IntN(len(n.clients))]
	seed := n.rng.Uint64()
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 5))
		q := c.Queue("completed")
		for i := 0; ctx.Err() == nil; i++ {
			g := groups[rng.IntN(len(groups))]
			if i%4 == 0 && len(n.r.stormGroups()) < 6 {
				g = n.r.addStormGroup()
			}
			o := queen.PopOptions{Group: g, Batch: 1 + rng.IntN(100), Partitions: 1 + rng.IntN(16), LeaseTime: 2 * time.Second}
			msgs := recordPop(ctx, n.r.rec, "storm", q, o)
			last := map[string]*queen.Message{}
			for _, m := range msgs {
				last[m.Partition] = m
			}
			for _, m := range last {
				_ = recordSettle(ctx, n.r.rec, "storm", m, "ack", nil)
			}
		}
	})
	wg.Wait()
	return nil
}

// seedRaces repeats seedRace for as long as ctx lasts (the whole run: a
// storm is too short for more than a round or two on a loaded machine),
// with retention_step run by connections of its own.
func (n *nemesis) seedRaces(ctx context.Context, c *queen.Client, rng *rand.Rand) {
	conns := make([]*pgx.Conn, 6)
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close(context.Background())
			}
		}
	}()
	for ctx.Err() == nil {
		for i, conn := range conns {
			if conn == nil || conn.IsClosed() {
				var err error
				if conns[i], err = pgx.Connect(ctx, n.r.url()); err != nil {
					conns[i] = nil
				}
			}
		}
		if slices.Contains(conns, nil) {
			time.Sleep(100 * time.Millisecond) // the database is down
			continue
		}
		n.seedRace(ctx, c, conns, rng)
	}
}

// seedRace races a group's first cursor rows against retention_step. On a
// fresh queue with CompletedRetention, "late" makes first contact before
// any partition exists; messages go to several partitions; "base" reads
// them all; then late pops one partition with a window over all of them,
// which seeds late's cursors on the others (at their log start - 1) while
// the connections run retention_step on them. Status then shows where
// late's cursors are: what is above one is late's to read. One round in
// four late's first contact is that racing pop itself: what retention
// deleted before it is not late's, and its cursors start past it.
func (n *nemesis) seedRace(ctx context.Context, c *queen.Client, conns []*pgx.Conn, rng *rand.Rand) {
	const parts = 12
	name := fmt.Sprintf("seed-%d", n.r.fresh.Add(1))
	n.r.addQueue(name, history.QueueInfo{Deduped: true, Completed: true, Groups: []string{"base", "late"}})
	q := c.Queue(name)
	// Due as soon as base has read it: only late holds it back.
	if err := q.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, CompletedRetention: time.Millisecond, LeaseTime: 2 * time.Second}); err != nil {
		return
	}
	rec := n.r.rec
	pop := func(g string, batch, partitions int) []*queen.Message {
		return recordPop(ctx, rec, "seedrace", q, queen.PopOptions{Group: g, Batch: batch, Partitions: partitions, LeaseTime: 2 * time.Second})
	}
	if rng.IntN(4) != 0 {
		pop("late", 1, 1)
	}
	items := make([]queen.Item, parts)
	for i := range items {
		tx := fmt.Sprintf("%s/%d", name, i)
		items[i] = queen.Item{Partition: fmt.Sprintf("p%d", i), TransactionID: tx, Data: payload(name, tx)}
	}
	inv := rec.Invoke(history.Event{Proc: "seedrace", Op: history.OpPush, Queue: name, Items: histItems(items)})
	// Push must not fail for the run's end: it would be Buffered, not an error.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	res, err := q.Push(pctx, items)
	cancel()
	if err != nil {
		rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return
	}
	rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
	for _, r := range res {
		if r.Status != queen.Queued {
			return
		}
	}
	acked := 0
	for try := 0; try < 4 && acked < parts && ctx.Err() == nil; try++ {
		acked += ackAll(ctx, rec, "seedrace", q, pop("base", parts, parts))
	}
	if acked == 0 {
		return // what base did not read stays pinned: no race there
	}
	rows, err := conns[0].Query(ctx, fmt.Sprintf(`SELECT p.id FROM %[1]s.partitions p JOIN %[1]s.queues q ON q.id = p.queue_id WHERE q.name = $1`,
		pgx.Identifier{n.r.schema}.Sanitize()), name)
	if err != nil {
		conns[0].Close(context.Background())
		return
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(pids) == 0 {
		return
	}
	step := fmt.Sprintf(`DISCARD PLANS; SELECT %s.retention_step(%%d, 1000)`, pgx.Identifier{n.r.schema}.Sanitize())
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
				// Plans discarded: retention_step plans its second statement
				// after the first one's snapshot, which widens the window.
				if _, err := conn.Exec(ctx, fmt.Sprintf(step, pids[(i+j*len(conns))%len(pids)]), pgx.QueryExecModeSimpleProtocol); err != nil {
					conn.Close(context.Background())
					return
				}
			}
		})
	}
	time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
	got := pop("late", 1, 1)
	close(stop)
	wg.Wait()
	if st, err := q.Status(ctx); err == nil {
		for _, p := range st.Partitions {
			for _, g := range p.Groups {
				if g.Group == "late" {
					inv := rec.Invoke(history.Event{Proc: "seedrace", Op: history.OpCall, Kind: "cursor", Queue: name, Group: "late", Partition: p.Name, Offset: g.Committed})
					rec.Done(inv, history.OK, history.Event{})
				}
			}
		}
	}
	ackAll(ctx, rec, "seedrace", q, got) // the final drain reads the rest
}

// ackAll acks msgs in one AckBatch, records each, and returns how many
// applied.
func ackAll(ctx context.Context, rec *history.Recorder, proc string, q *queen.Queue, msgs []*queen.Message) int {
	if len(msgs) == 0 {
		return 0
	}
	reqs := make([]queen.AckRequest, len(msgs))
	invs := make([]history.Event, len(msgs))
	for i, m := range msgs {
		reqs[i] = queen.AckRequest{Message: m, Status: queen.AckSuccess}
		invs[i] = rec.Invoke(settleEvent(proc, m, "ack"))
	}
	errs, err := q.AckBatch(ctx, reqs)
	n := 0
	for i, inv := range invs {
		switch {
		case err != nil:
			rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		case errs[i] == nil:
			rec.Done(inv, history.OK, history.Event{})
			n++
		case errors.Is(errs[i], queen.ErrLeaseLost), errors.Is(errs[i], queen.ErrAlreadyAcked):
			rec.Done(inv, history.Fail, history.Event{Err: errs[i].Error(), LeaseLost: errors.Is(errs[i], queen.ErrLeaseLost)})
		default:
			rec.Done(inv, history.Info, history.Event{Err: errs[i].Error()})
		}
	}
	return n
}
