package queen_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// The outbox pattern meets an operator: a handler's lease is released
// (queen lease release) while it runs, then the handler acks its message
// and pushes an event in one Client.Tx. The Tx must fail with
// ErrLeaseLost and push nothing; the message comes back to the next
// holder, whose Tx commits: one event per message, none lost, none twice.
// With and without KeyConcurrency (whose acks settle single offsets).
func TestReleaseLeaseBeforeTxAckInHandler(t *testing.T) {
	for _, tc := range []struct {
		name    string
		keyConc int
	}{{"plain", 0}, {"keyed", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			c := open(t)
			ctx := ctxT(t)
			q := c.Queue("q")
			out := c.Queue("out")
			pushKeyed(t, q, "p", "a", "b")

			released := make(chan struct{})
			running := make(chan struct{}, 2)
			var mu sync.Mutex
			var errs []string
			attempts := map[int64]int{}
			cctx, stop := context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() {
				errc <- q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g", Batch: 10},
					KeyConcurrency: tc.keyConc}, func(hctx context.Context, m *queen.Message) error {
					mu.Lock()
					attempts[m.Offset]++
					n := attempts[m.Offset]
					mu.Unlock()
					// Began under the released lease: only then must its Tx fail.
					before := true
					select {
					case <-released:
						before = false
					default:
					}
					if before {
						running <- struct{}{}
						select {
						case <-released:
						case <-hctx.Done():
							return hctx.Err()
						}
					}
					err := c.Tx(hctx, func(tx *queen.Tx) error {
						tx.Ack(m)
						tx.Push("out", []queen.Item{{TransactionID: fmt.Sprintf("evt-%d-%d", m.Offset, n),
							Data: fmt.Appendf(nil, "%d", m.Offset)}})
						return nil
					})
					switch {
					case before && !errors.Is(err, queen.ErrLeaseLost):
						mu.Lock()
						errs = append(errs, fmt.Sprintf("offset %d: Tx after the release = %v, want ErrLeaseLost", m.Offset, err))
						mu.Unlock()
					case !before && err != nil:
						mu.Lock()
						errs = append(errs, fmt.Sprintf("offset %d: Tx of the next holder = %v", m.Offset, err))
						mu.Unlock()
					}
					return err
				})
			}()
			// Both messages in their handlers (a plain Consume runs them one
			// after the other: only the first is waited for there).
			<-running
			if tc.keyConc > 1 {
				<-running
			}
			ok, err := q.ReleaseLease(ctx, "g", "p")
			if err != nil || !ok {
				t.Fatalf("ReleaseLease = %v, %v", ok, err)
			}
			close(released)
			waitFor(t, 30*time.Second, "the group caught up", func() bool {
				g, ok := gstat(t, q, "g", "p")
				return ok && g.Committed == 1 && !g.Leased
			})
			stop()
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			got := pop(t, out, queen.PopOptions{Batch: 10, AutoAck: true})
			seen := map[string]int{}
			for _, m := range got {
				seen[string(m.Data)]++
			}
			if len(got) != 2 || seen["0"] != 1 || seen["1"] != 1 {
				t.Fatalf("out holds %q, want one event for each of offsets 0 and 1", datas(got))
			}
		})
	}
}
