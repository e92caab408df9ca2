package queen_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen"
)

// A push racing Queue.Delete either stores its items (re-creating the
// queue) or fails with SQLSTATE QN001, queen's code for a queue or
// partition deleted under the call: never with the raw foreign-key error of
// a partition created for the queue row being deleted.
func TestPushRacingDeleteGetsQN001(t *testing.T) {
	c := open(t, manual)
	ctx := ctxT(t)
	q := c.Queue("q")
	pushes := map[string]func(i int) error{
		"Push": func(i int) error {
			res, err := q.Push(ctx, []queen.Item{{Partition: fmt.Sprintf("p%d", i), Data: []byte("x")}})
			if err == nil && res[0].Status == queen.Failed {
				err = res[0].Err
			}
			return err
		},
		"PushTx": func(i int) error {
			return pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
				_, err := q.PushTx(ctx, tx, []queen.Item{{Partition: fmt.Sprintf("t%d", i), Data: []byte("x")}})
				return err
			})
		},
		"Tx.Push": func(i int) error {
			return c.Tx(ctx, func(tx *queen.Tx) error {
				tx.Push("q", []queen.Item{{Partition: fmt.Sprintf("x%d", i), Data: []byte("x")}})
				return nil
			})
		},
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := map[string]error{}
	var ok, gone atomic.Int64
	for name, push := range pushes {
		for w := range 2 {
			wg.Go(func() {
				for i := w; !stop.Load(); i += 2 {
					err := push(i) // a new partition every time: each push provisions
					var pgErr *pgconn.PgError
					switch {
					case err == nil:
						ok.Add(1)
					case errors.As(err, &pgErr) && pgErr.Code == "QN001":
						gone.Add(1)
					default:
						mu.Lock()
						bad[name] = err
						mu.Unlock()
					}
				}
			})
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if err := q.Delete(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("Delete: %v", err)
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	for name, err := range bad {
		t.Errorf("%s racing Delete: %v; want success or SQLSTATE QN001", name, err)
	}
	t.Logf("%d pushes stored, %d got QN001", ok.Load(), gone.Load())
}
