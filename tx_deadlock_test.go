package queen_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// Two Client.Tx each making the first keyed pushes to two queues (that
// exist, with no keyed segment yet; each Tx to its own partitions),
// recorded in opposite orders, both commit.
func TestTxFirstKeyedPushesOppositeOrders(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	for round := range 20 {
		qa, qb := fmt.Sprintf("a%d", round), fmt.Sprintf("b%d", round)
		// The queues exist, with no keyed segment yet.
		push(t, c.Queue(qa), queen.Item{Data: []byte("plain")})
		push(t, c.Queue(qb), queen.Item{Data: []byte("plain")})
		var start, wg sync.WaitGroup
		start.Add(1)
		errs := make([]error, 2)
		for i, order := range [][]string{{qa, qb}, {qb, qa}} {
			wg.Go(func() {
				start.Wait()
				errs[i] = c.Tx(ctx, func(tx *queen.Tx) error {
					for _, q := range order {
						tx.Push(q, []queen.Item{{Partition: fmt.Sprint("t", i), Key: "k", Data: []byte("x")}})
					}
					return nil
				})
			})
		}
		start.Done()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: Tx %d: %v", round, i, err)
			}
		}
	}
}

// The same with PushTx in the callers' own transactions, one call per
// queue, in opposite orders: each transaction writes its own partitions,
// so only the queue rows (marked keyed by the first keyed push) are shared,
// and neither transaction may hold one while it waits for the other.
func TestPushTxFirstKeyedPushesOppositeOrders(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	for round := range 20 {
		qa, qb := fmt.Sprintf("a%d", round), fmt.Sprintf("b%d", round)
		push(t, c.Queue(qa), queen.Item{Data: []byte("plain")})
		push(t, c.Queue(qb), queen.Item{Data: []byte("plain")})
		var start, wg sync.WaitGroup
		start.Add(1)
		errs := make([]error, 2)
		for i, order := range [][]string{{qa, qb}, {qb, qa}} {
			wg.Go(func() {
				start.Wait()
				errs[i] = pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
					for _, q := range order {
						if _, err := c.Queue(q).PushTx(ctx, tx, []queen.Item{{Partition: fmt.Sprint("t", i), Key: "k", Data: []byte("x")}}); err != nil {
							return err
						}
					}
					return nil
				})
			})
		}
		start.Done()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: tx %d: %v", round, i, err)
			}
		}
	}
}
