package history_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
	"github.com/e03140bc/queen/queenui"
)

// What the run observes beyond the log: a client's metrics, the
// dashboard's replay actions, and where a SubscribeFrom group starts. Each
// round makes a fresh queue only it touches, so what it judges (a counter
// of that queue, a dead letter of it, its from-boundary) is its alone.

// observe runs rounds of the observing generators that are on, with c
// (proc), until ctx ends.
func (r *run) observe(ctx context.Context, c *queen.Client, proc string) {
	var wg sync.WaitGroup
	for i, k := range []string{"dashboard", "metrics", "fromedge"} {
		if !r.gen[k] {
			continue
		}
		rng := rand.New(rand.NewPCG(r.seed, 0x0b5e+uint64(i)))
		// One loop per kind: a round takes seconds on a loaded machine,
		// and every kind is to have one in a seed of 8 s.
		wg.Go(func() {
			n, took := 0, time.Duration(0)
			defer func() { r.t.Logf("observe: %d rounds of %s (%v in all)", n, k, took.Round(time.Millisecond)) }()
			for ; ctx.Err() == nil; n++ {
				// A round begun runs to its end: the run's end must not cut
				// it short (what it judges comes at its end).
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				start := time.Now()
				switch k {
				case "metrics":
					r.metered(rctx, c, proc, rng)
				case "dashboard":
					r.dashboard(rctx, c, proc, rng)
				case "fromedge":
					r.fromEdge(rctx, c, proc, rng)
				}
				took += time.Since(start)
				cancel()
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(200+rng.IntN(400)) * time.Millisecond):
				}
			}
		})
	}
	wg.Wait()
}

// freshQueue names a queue of this round and audits it.
func (r *run) freshQueue(prefix string, qi history.QueueInfo) string {
	q := fmt.Sprintf("%s-%d", prefix, r.fresh.Add(1))
	r.addQueue(q, qi)
	return q
}

// pushRecorded pushes items to q and records the call; it returns the
// results (nil on an error).
func pushRecorded(ctx context.Context, rec *history.Recorder, proc string, q *queen.Queue, items []queen.Item) []queen.PushResult {
	inv := rec.Invoke(history.Event{Proc: proc, Op: history.OpPush, Queue: q.Name(), Items: histItems(items)})
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	res, err := q.Push(pctx, items)
	if err != nil {
		rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return nil
	}
	rec.Done(inv, history.OK, history.Event{Results: histResults(res)})
	return res
}

func fresh(q string, n int) []queen.Item {
	items := make([]queen.Item, n)
	for i := range items {
		tx := fmt.Sprintf("%s/%d", q, i)
		items[i] = queen.Item{Partition: "p", TransactionID: tx, Data: payload(q, tx)}
	}
	return items
}

// metered pushes a few messages to a fresh queue and consumes them in one
// batch at a time (KeyConcurrency 1) whose handlers ack some of their
// messages themselves in Client.Tx: the first batch's last one acked by
// Consume (what it settles must not count the handlers' acks again), the
// second's by its handler (Consume has nothing left to settle: it must not
// warn).
func (r *run) metered(ctx context.Context, c *queen.Client, proc string, rng *rand.Rand) {
	q := r.freshQueue("meter", history.QueueInfo{Deduped: true, Groups: []string{""}, DeadLetter: true})
	cq := c.Queue(q)
	if err := cq.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, RetryLimit: 2, DeadLetter: true, LeaseTime: 5 * time.Second}); err != nil {
		return
	}
	// Two batches of n: the first ends with a message Consume acks, the
	// second with one its handler acked.
	n := 3 + rng.IntN(3)
	if pushRecorded(ctx, r.rec, proc, cq, fresh(q, 2*n)) == nil {
		return
	}
	own := make([]bool, 2*n)
	for b := range 2 {
		for i := range n - 1 {
			own[b*n+i] = rng.IntN(2) == 0
		}
		own[b*n+rng.IntN(n-1)] = true
	}
	own[2*n-1] = true
	cctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	var handled sync.WaitGroup
	handled.Add(2 * n)
	go func() { handled.Wait(); cancel() }()
	var once sync.Map
	_ = cq.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: n, LeaseTime: 5 * time.Second}},
		func(hctx context.Context, m *queen.Message) error {
			inv := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpHandler, Queue: q, Group: m.Group,
				Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}, BadData: badData(m)})
			if m.Offset < int64(len(own)) && own[m.Offset] {
				sinv := r.rec.Invoke(settleEvent(proc, m, "ack"))
				err := c.Tx(hctx, func(tx *queen.Tx) error {
					tx.Ack(m)
					return nil
				})
				switch {
				case err == nil:
					r.rec.Done(sinv, history.OK, history.Event{})
				case errors.Is(err, queen.ErrTxAborted):
					r.rec.Done(sinv, history.Fail, history.Event{Err: err.Error(), LeaseLost: errors.Is(err, queen.ErrLeaseLost)})
				default:
					r.rec.Done(sinv, history.Info, history.Event{Err: err.Error()})
				}
			}
			r.rec.Done(inv, history.OK, history.Event{})
			if _, dup := once.LoadOrStore(m.Offset, true); !dup {
				handled.Done()
			}
			return nil
		})
}

// dashboard drives queenui's replay actions as an operator would, over
// HTTP: two dead letters of one group and partition stored in the same
// microsecond (as one fused settle stores them: set here by hand), the
// first one replayed by several operators at once (exactly one copy of
// it, none of the other); then "replay all" confirmed, a message
// dead-lettered after the confirmation, and the confirmed form posted
// (what came after the confirmation stays a dead letter).
func (r *run) dashboard(ctx context.Context, c *queen.Client, proc string, rng *rand.Rand) {
	q := r.freshQueue("ui", history.QueueInfo{Deduped: true, Groups: []string{""}, DeadLetter: true})
	cq := c.Queue(q)
	if err := cq.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, RetryLimit: 2, DeadLetter: true, LeaseTime: 10 * time.Second}); err != nil {
		return
	}
	const n, dead = 6, 4
	if pushRecorded(ctx, r.rec, proc, cq, fresh(q, n)) == nil {
		return
	}
	msgs := recordPop(ctx, r.rec, proc, cq, queen.PopOptions{Partition: "p", Batch: n, Wait: 2 * time.Second, LeaseTime: 10 * time.Second})
	if len(msgs) != n {
		return
	}
	defer func() { _ = recordSettle(ctx, r.rec, proc, msgs[n-1], "ack", nil) }()
	for _, m := range msgs[:dead] {
		if recordSettle(ctx, r.rec, proc, m, "dead", nil) != nil {
			return
		}
	}
	if _, err := c.Pool().Exec(ctx, fmt.Sprintf(`UPDATE %[1]s.dead_letters d SET created_at = date_trunc('second', d.created_at)
		FROM %[1]s.queues q WHERE q.id = d.queue_id AND q.name = $1`, pgx.Identifier{r.schema}.Sanitize()), q); err != nil {
		return
	}
	d := newDash(c)
	if !d.open(q) {
		return
	}
	hd := func(dl queen.DeadLetter) history.Delivery {
		return history.Delivery{Partition: dl.Partition, Offset: dl.Offset, ID: dl.MessageID.String(), TxID: dl.TransactionID}
	}
	// Operators replay the oldest dead letter at once, staggered so that
	// one's replay may land between another's reading of the dead letter
	// and its requeue; then the next oldest that is left.
	for range dead - 1 {
		dls, err := cq.DeadLetters(ctx, queen.DeadLetterQuery{Limit: 10})
		if err != nil || len(dls) < 2 {
			break
		}
		var kept []history.Delivery
		for _, dl := range dls[1:] {
			kept = append(kept, hd(dl))
		}
		var wg sync.WaitGroup
		for i := range 8 {
			pause := time.Duration(i*700+rng.IntN(500)) * time.Microsecond
			wg.Go(func() {
				time.Sleep(pause)
				inv := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpCall, Kind: "requeue", Queue: q, Group: dls[0].Group,
					Msgs: []history.Delivery{hd(dls[0])}, Kept: kept})
				r.doneHTTP(inv, d.post(url.Values{"queue": {q}, "id": {strconv.FormatInt(dls[0].ID, 10)}, "confirm": {"yes"}}))
			})
		}
		wg.Wait()
	}
	// Replay all: the confirmation names the highest id there is now.
	page := d.post(url.Values{"queue": {q}})
	max, ok := hiddenInput(page.Body.String(), "max")
	if page.Code != http.StatusOK || !ok {
		return
	}
	maxID, err := strconv.ParseInt(max, 10, 64)
	if err != nil {
		return
	}
	confirmed, err := cq.DeadLetters(ctx, queen.DeadLetterQuery{Limit: 10})
	if err != nil {
		return
	}
	if recordSettle(ctx, r.rec, proc, msgs[dead], "dead", nil) != nil {
		return
	}
	after, err := cq.DeadLetters(ctx, queen.DeadLetterQuery{Limit: 10})
	if err != nil {
		return
	}
	var ms, kept []history.Delivery
	for _, dl := range after {
		switch {
		case dl.ID > maxID:
			kept = append(kept, hd(dl))
		case slices.ContainsFunc(confirmed, func(x queen.DeadLetter) bool { return x.ID == dl.ID }):
			ms = append(ms, hd(dl))
		}
	}
	inv := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpCall, Kind: "requeue", Queue: q, Group: "", Msgs: ms, Kept: kept})
	r.doneHTTP(inv, d.post(url.Values{"queue": {q}, "max": {max}, "confirm": {"yes"}}))
}

// doneHTTP completes a dashboard action: a redirect is done, "not found"
// (the dead letter is gone) certainly did nothing, anything else is
// unknown.
func (r *run) doneHTTP(inv history.Event, res *httptest.ResponseRecorder) {
	switch res.Code {
	case http.StatusSeeOther:
		r.rec.Done(inv, history.OK, history.Event{})
	case http.StatusNotFound:
		r.rec.Done(inv, history.Fail, history.Event{Err: "404"})
	default:
		r.rec.Done(inv, history.Info, history.Event{Err: fmt.Sprintf("HTTP %d", res.Code)})
	}
}

// dash is one operator's browser session with a dashboard of actions.
type dash struct {
	h      http.Handler
	cookie *http.Cookie
	token  string
}

func newDash(c *queen.Client) *dash {
	return &dash{h: queenui.New(c, queenui.Options{Actions: true, Refresh: -1, Logger: slog.New(slog.DiscardHandler)})}
}

// open loads a queue's page: the session's cookie and form token.
func (d *dash) open(q string) bool {
	res := httptest.NewRecorder()
	d.h.ServeHTTP(res, httptest.NewRequest(http.MethodGet, "/queue?name="+url.QueryEscape(q), nil))
	for _, ck := range res.Result().Cookies() {
		d.cookie = ck
	}
	var ok bool
	d.token, ok = hiddenInput(res.Body.String(), "token")
	return res.Code == http.StatusOK && ok && d.cookie != nil
}

func (d *dash) post(form url.Values) *httptest.ResponseRecorder {
	form.Set("token", d.token)
	req := httptest.NewRequest(http.MethodPost, "/replay", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(d.cookie)
	res := httptest.NewRecorder()
	d.h.ServeHTTP(res, req)
	return res
}

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="([a-z]+)" value="([^"]*)">`)

func hiddenInput(page, name string) (string, bool) {
	for _, m := range hiddenRE.FindAllStringSubmatch(page, -1) {
		if m[1] == name {
			return m[2], true
		}
	}
	return "", false
}

// fromEdge: a PushTx holds a partition's row while a Push to it waits;
// the group "edge" is to start from a time taken while it
// waits, before the commit. The waiting push is stored once the row is
// free, after that time: the group must get it, and everything after it.
func (r *run) fromEdge(ctx context.Context, c *queen.Client, proc string, rng *rand.Rand) {
	// With and without a dedup window: an isolated push takes the
	// single-segment function or one plain statement.
	window := []time.Duration{0, time.Hour}[rng.IntN(2)]
	qi := history.QueueInfo{Deduped: window > 0, Groups: []string{""}, FromGroups: map[string]int64{}}
	q := r.freshQueue("edge", qi)
	cq := c.Queue(q)
	if err := cq.Configure(ctx, queen.QueueOptions{DedupWindow: window, LeaseTime: 5 * time.Second}); err != nil {
		return
	}
	items := fresh(q, 4)
	// The partition exists, and this client pushed to it: the waiting push
	// is an isolated one, which does not lock the row ahead.
	if res := pushRecorded(ctx, r.rec, proc, cq, items[:1]); res == nil || res[0].Status != queen.Queued {
		return
	}
	inv := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpPush, Kind: "pushtx", Queue: q, Items: histItems(items[1:2])})
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		r.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
		return
	}
	defer tx.Rollback(context.Background())
	res, err := cq.PushTx(ctx, tx, items[1:2])
	if err != nil {
		r.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
		return
	}
	waited := make(chan struct{})
	var stored bool // the waiting push was Queued: stored before it returned
	go func() {
		defer close(waited)
		res := pushRecorded(ctx, r.rec, proc, cq, items[2:3])
		stored = res != nil && res[0].Status == queen.Queued
	}()
	time.Sleep(300 * time.Millisecond) // the push is waiting for the row
	from := time.Now()
	edge := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpCall, Kind: "from-edge", Queue: q, Group: "edge", Partition: "p", T: from.UnixNano()})
	// A from group from here on (its first delivery is its baseline), that
	// owes nothing until it was read to its end.
	r.extraMu.Lock()
	qi.FromGroups["edge"] = math.MaxInt64
	r.extraMu.Unlock()
	time.Sleep(20 * time.Millisecond)
	r.rec.Done(edge, history.OK, history.Event{})
	if err := tx.Commit(ctx); err != nil {
		r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		<-waited
		return
	}
	r.rec.Done(inv, history.OK, history.Event{Results: histResults(res)})
	<-waited
	last := pushRecorded(ctx, r.rec, proc, cq, items[3:])
	if last == nil || !stored {
		// Stored or not, unknown (the drain could not tell its end), or
		// stored when its spool is replayed, past the drain.
		return
	}
	// The group's first contact, and its drain to the last push (a
	// Buffered one is stored once its spool is replayed): retried through
	// faults, judged only once it ended.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for seen := false; !seen; {
		if dctx.Err() != nil {
			return
		}
		msgs := recordPop(dctx, r.rec, proc, cq, queen.PopOptions{Group: "edge", Subscription: queen.SubscribeFrom(from), Batch: 10, LeaseTime: 5 * time.Second})
		if len(msgs) == 0 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for _, m := range msgs {
			seen = seen || m.TransactionID == items[3].TransactionID
		}
		_ = recordSettle(dctx, r.rec, proc, msgs[len(msgs)-1], "ack", nil)
	}
	r.extraMu.Lock()
	qi.FromGroups["edge"] = from.UnixNano()
	r.extraMu.Unlock()
	d := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpCall, Kind: "from-drained", Queue: q, Group: "edge"})
	r.rec.Done(d, history.OK, history.Event{})
}

// observed is what the run keeps for these generators.
type observed struct {
	readers map[string]*sdkmetric.ManualReader // per metered client's proc
}

// meterProvider returns a MeterProvider whose counters the run reads
// after the client closed (recordMetrics).
func (r *run) meterProvider(proc string) *sdkmetric.MeterProvider {
	rd := sdkmetric.NewManualReader()
	r.extraMu.Lock()
	defer r.extraMu.Unlock()
	if r.obs.readers == nil {
		r.obs.readers = map[string]*sdkmetric.ManualReader{}
	}
	r.obs.readers[proc] = rd
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
}

// recordMetrics records each metered client's consume-side counters per
// queue and group as "metrics" calls. shared are the procs that used any
// of these clients (a client drawn at random): their calls may be any
// one's.
func (r *run) recordMetrics(ctx context.Context, shared []string) {
	r.extraMu.Lock()
	defer r.extraMu.Unlock()
	for proc, rd := range r.obs.readers {
		var rm metricdata.ResourceMetrics
		if err := rd.Collect(ctx, &rm); err != nil {
			r.t.Errorf("metrics of %s: %v", proc, err)
			continue
		}
		type qg struct{ q, g string }
		counts := map[qg]map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != "queen.client.settled.messages" && m.Name != "messaging.client.consumed.messages" {
					continue
				}
				sum, ok := m.Data.(metricdata.Sum[int64])
				if !ok {
					continue
				}
				for _, dp := range sum.DataPoints {
					q, _ := dp.Attributes.Value("messaging.destination.name")
					g, _ := dp.Attributes.Value("messaging.consumer.group.name")
					op, _ := dp.Attributes.Value("messaging.operation.name")
					k := qg{q.AsString(), g.AsString()}
					if k.g == "lagger" {
						continue // the status generator's unrecorded pops
					}
					if counts[k] == nil {
						counts[k] = map[string]int64{}
					}
					counts[k][op.AsString()] += dp.Value
				}
			}
		}
		for k, cs := range counts {
			inv := r.rec.Invoke(history.Event{Proc: proc, Op: history.OpCall, Kind: "metrics", Queue: k.q, Group: k.g, Counts: cs, Procs: shared})
			r.rec.Done(inv, history.OK, history.Event{})
		}
	}
}
