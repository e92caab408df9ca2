package history_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// deleteRace deletes the "doomed" queue again and again for a moment while
// three goroutines of this worker push to partitions the queue has not seen:
// each such push adds partition rows, which is where a push meets Delete
// (the foreign keys of the rows it adds, the leaf rows Delete removes).
// Occasional single Deletes meet a push only by luck.
func (w *worker) deleteRace(ctx context.Context) {
	burst := w.rng.Uint64() % 1e6
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 3 {
		rng := rand.New(rand.NewPCG(w.rng.Uint64(), w.rng.Uint64()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				items := make([]queen.Item, 1+rng.IntN(4))
				for j := range items {
					// The worker's own prefix keeps ids distinct across
					// workers; the burst, pusher and counters within it.
					tx := w.proc + "." + strconv.Itoa(w.idx) + "/race" + strconv.FormatUint(burst, 36) + "-" + strconv.Itoa(g) + "-" + strconv.Itoa(i) + "-" + strconv.Itoa(j)
					items[j] = queen.Item{Partition: fmt.Sprintf("r%d", rng.IntN(100000)), TransactionID: tx, Data: payload("doomed", tx)}
				}
				pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				w.racePush(pctx, g, items)
				cancel()
			}
		}()
	}
	end := time.Now().Add(time.Duration(300+w.rng.IntN(300)) * time.Millisecond)
	for time.Now().Before(end) && ctx.Err() == nil {
		inv := w.call("doomed", "", "delete", false)
		w.done(inv, w.c.Queue("doomed").Delete(ctx), nil)
	}
	close(stop)
	wg.Wait()
	_ = w.c.Queue("doomed").Configure(context.WithoutCancel(ctx), w.options("doomed"))
}

// racePush pushes items to "doomed" by Push, PushTx or Client.Tx (by g):
// the three paths provision partitions differently.
func (w *worker) racePush(ctx context.Context, g int, items []queen.Item) {
	q := w.c.Queue("doomed")
	switch g {
	case 0:
		inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Queue: "doomed", Items: histItems(items)})
		res, err := q.Push(ctx, items)
		if err != nil {
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
			return
		}
		w.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
	case 1:
		inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Kind: "pushtx", Queue: "doomed", Items: histItems(items)})
		var res []queen.PushResult
		err := pgx.BeginFunc(ctx, w.c.Pool(), func(tx pgx.Tx) error {
			var err error
			res, err = q.PushTx(ctx, tx, items)
			return err
		})
		if err != nil {
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
			return
		}
		w.rec.Done(inv, history.OK, history.Event{Results: histResults(res)})
	default:
		inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Kind: "tx", Queue: "doomed", Items: histItems(items)})
		err := w.c.Tx(ctx, func(tx *queen.Tx) error {
			tx.Push("doomed", items)
			return nil
		})
		if err != nil {
			w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
			return
		}
		res := make([]history.Result, len(items))
		for i := range res {
			res[i] = history.Result{Status: "committed", Offset: -1}
		}
		w.rec.Done(inv, history.OK, history.Event{Results: res})
	}
}

// deleteRaces runs deleteRace about every second until ctx ends.
func (w *worker) deleteRaces(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(400+w.rng.IntN(800)) * time.Millisecond):
		}
		w.deleteRace(ctx)
	}
}
