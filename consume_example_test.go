package queen_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/e03140bc/queen"
)

// Graceful shutdown: SIGTERM (or Ctrl-C) ends ctx, so Consume stops
// claiming and hands back, uncharged, every message it has not started:
// another process takes them at once, as a first attempt. Handlers already
// running keep an uncancelled context for up to SoftStop; what they finish
// is acked, and an error they return after their context was cancelled by
// the stop counts as interrupted, not failed. Keep SoftStop plus the Close
// timeout inside the orchestrator's grace period (30s by default on
// Kubernetes).
func ExampleQueue_Consume_gracefulShutdown() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := client.Close(cctx); err != nil {
			fmt.Println(err)
		}
	}()

	orders := client.Queue("orders")
	if _, err := orders.Push(ctx, []queen.Item{
		{TransactionID: "order-1"}, {TransactionID: "order-2"}, {TransactionID: "order-3"},
	}); err != nil {
		fmt.Println(err)
		return
	}

	err = orders.Consume(ctx, queen.ConsumeOptions{
		PopOptions:     queen.PopOptions{Batch: 100},
		Concurrency:    16,
		SoftStop:       20 * time.Second,
		HandlerTimeout: time.Minute,
	}, func(hctx context.Context, m *queen.Message) error {
		fmt.Println("handling", m.TransactionID)
		// Here the orchestrator's SIGTERM arrives mid-handler (simulated).
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		<-ctx.Done()
		// SoftStop: this handler's context is still live, so it finishes.
		fmt.Println("finished", m.TransactionID, "after the signal; handler context:", hctx.Err())
		return nil
	})
	fmt.Println("Consume returned", err)

	// The unstarted rest was handed back at once: the next consumer gets it
	// now, as a first attempt, not after the lease time.
	msgs, _ := orders.Pop(context.Background(), queen.PopOptions{Batch: 10})
	for _, m := range msgs {
		fmt.Println("next consumer:", m.TransactionID, "attempt", m.Attempt)
	}
	// Output:
	// handling order-1
	// finished order-1 after the signal; handler context: <nil>
	// Consume returned <nil>
	// next consumer: order-2 attempt 1
	// next consumer: order-3 attempt 1
}
