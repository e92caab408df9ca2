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

// A Tx.Push to queues a and b, held up on a's row, meets b deleted and
// created again by another push, and that new b being deleted: the push
// gets QN001 (or succeeds), not a foreign-key error for a partition added
// to the new b, whose row it never locked.
func TestTxPushRacingDeleteOfRecreatedQueueGetsQN001(t *testing.T) {
	skipOnLayout(t, "a lock shape: it waits for a push blocked on a queue's row lock; on the layout pushes and Queue.Delete meet on an advisory lock (TestOnCitus/DistributedDeleteRacesPush)")
	c := open(t, manual)
	ctx := ctxT(t)
	s := pgx.Identifier{c.Schema()}.Sanitize()
	a, b := c.Queue("a"), c.Queue("b")
	push(t, a, queen.Item{Partition: "p0", Data: []byte("x")}) // a's id < b's
	push(t, b, queen.Item{Partition: "p0", Data: []byte("x")})

	// hold locks a's row as a Delete would.
	hold, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(context.Background())
	if _, err := hold.Exec(ctx, "SELECT 1 FROM "+s+".queues WHERE name = 'a' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- c.Tx(ctx, func(tx *queen.Tx) error {
			tx.Push("a", []queen.Item{{Partition: "p1", Data: []byte("x")}})
			tx.Push("b", []queen.Item{{Partition: "p1", Data: []byte("x")}})
			return nil
		})
	}()
	waitForBlockedStatement(t, c, s+".push_bundle(")

	// b deleted, created again by another push, and that one being
	// deleted (uncommitted) when a's row is let go.
	if err := b.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	push(t, b, queen.Item{Partition: "p2", Data: []byte("x")})
	del, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer del.Rollback(context.Background())
	var delPID int32
	if err := del.QueryRow(ctx, "SELECT pg_backend_pid() FROM "+s+".queues WHERE name = 'b' AND "+s+".delete_queue(tenant, name)").Scan(&delPID); err != nil {
		t.Fatal(err)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The push either ends or waits for the uncommitted delete.
	var pushErr error
	ended := false
	waitFor(t, 20*time.Second, "the Tx to end or wait for the delete", func() bool {
		select {
		case pushErr = <-done:
			ended = true
			return true
		default:
		}
		var n int
		if err := c.Pool().QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", delPID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := del.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !ended {
		pushErr = <-done
	}
	var pgErr *pgconn.PgError
	if pushErr != nil && !(errors.As(pushErr, &pgErr) && pgErr.Code == "QN001") {
		t.Fatalf("Tx.Push: %v; want success or SQLSTATE QN001", pushErr)
	}
	t.Logf("Tx.Push: %v", pushErr)
}
