package history_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/history"
)

// deleteRace deletes the "doomed" queue a few times while a second
// goroutine of this worker pushes to partitions the queue has not seen:
// each such push adds partition rows, which is where a push meets Delete
// (the foreign keys of the rows it adds, the leaf rows Delete removes).
// Occasional single Deletes meet a push only by luck.
func (w *worker) deleteRace(ctx context.Context) {
	rng := rand.New(rand.NewPCG(w.rng.Uint64(), w.rng.Uint64()))
	burst := w.rng.Uint64() % 1e6
	stop := make(chan struct{})
	var wg sync.WaitGroup
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
				// The worker's own prefix keeps ids distinct across workers;
				// "race" and the burst number across this worker's bursts.
				tx := w.proc + "." + strconv.Itoa(w.idx) + "/race" + strconv.FormatUint(burst, 36) + "-" + strconv.Itoa(i) + "-" + strconv.Itoa(j)
				items[j] = queen.Item{Partition: fmt.Sprintf("r%d", rng.IntN(10000)), TransactionID: tx, Data: payload("doomed", tx)}
			}
			inv := w.rec.Invoke(history.Event{Proc: w.proc, Op: history.OpPush, Queue: "doomed", Items: histItems(items)})
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			res, err := w.c.Queue("doomed").Push(pctx, items)
			cancel()
			if err != nil {
				w.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
				continue
			}
			w.rec.Done(inv, history.OK, history.Event{Results: histResults(res), ItemErr: itemErr(res)})
		}
	}()
	for range 2 + w.rng.IntN(3) {
		time.Sleep(time.Duration(w.rng.IntN(40)) * time.Millisecond)
		inv := w.call("doomed", "", "delete", false)
		w.done(inv, w.c.Queue("doomed").Delete(ctx), nil)
	}
	close(stop)
	wg.Wait()
	_ = w.c.Queue("doomed").Configure(context.WithoutCancel(ctx), w.options("doomed"))
}
