package queen_test

import (
	"context"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// A Pop racing Queue.Delete claims nothing and returns no error, as a Pop
// of a queue that does not exist: never the raw foreign-key error of a
// cursor or subscription inserted for a partition or queue the delete
// removes. The delete is left uncommitted (holding its locks, its rows
// deleted) until the Pop waits on it or ends.
func TestPopRacingDeleteClaimsNothing(t *testing.T) {
	skipOnLayout(t, "a lock shape: it waits for a pop blocked on the delete's uncommitted locks, which the layout's pop does not meet so")
	for _, tc := range []struct {
		name   string
		group  string
		member string
		setup  func(t *testing.T, q *queen.Queue, group string)
	}{
		// The group's first contact inserts its subscription (a foreign
		// key to the queue row being deleted).
		{"FirstContact", "g", "", func(t *testing.T, q *queen.Queue, _ string) {}},
		{"FirstContactQueueMode", "", "", func(t *testing.T, q *queen.Queue, _ string) {}},
		// A member's claim writes its member row first (a foreign key to
		// the queue row being deleted).
		{"Member", "g", "w1", func(t *testing.T, q *queen.Queue, _ string) {}},
		// A partition created after the group's first contact has no cursor
		// of the group: the pop seeds one (a foreign key to the partition
		// row being deleted).
		{"SeedCursor", "g", "", func(t *testing.T, q *queen.Queue, group string) {
			ctx := ctxT(t)
			if _, err := q.Pop(ctx, queen.PopOptions{Group: group, AutoAck: true}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := open(t, manual)
			ctx := ctxT(t)
			q := c.Queue("doomed")
			push(t, q, queen.Item{Partition: "p0", Data: []byte("x")})
			tc.setup(t, q, tc.group)
			push(t, q, queen.Item{Partition: "p1", Data: []byte("x")})

			del, err := c.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer del.Rollback(context.Background())
			s := c.Schema()
			var ok bool
			if err := del.QueryRow(ctx, `SELECT "`+s+`".delete_queue(tenant, name) FROM "`+s+`".queues WHERE name = 'doomed'`).Scan(&ok); err != nil || !ok {
				t.Fatalf("delete_queue: %v %v", ok, err)
			}

			type result struct {
				msgs []*queen.Message
				err  error
			}
			done := make(chan result, 1)
			go func() {
				msgs, err := q.Pop(ctx, queen.PopOptions{Group: tc.group, Batch: 10, Member: tc.member})
				done <- result{msgs, err}
			}()
			// The pop either ends (it skipped what is being deleted) or waits
			// for the delete.
			var r result
			ended := false
			waitFor(t, 20*time.Second, "the Pop to end or wait for the delete", func() bool {
				select {
				case r = <-done:
					ended = true
					return true
				default:
				}
				var n int
				if err := c.Pool().QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position('.pop_v2(' in query) > 0").Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n > 0
			})
			if err := del.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if !ended {
				r = <-done
			}
			if r.err != nil || len(r.msgs) != 0 {
				t.Fatalf("Pop racing Delete: %d messages, %v; want none and no error", len(r.msgs), r.err)
			}
		})
	}
}
