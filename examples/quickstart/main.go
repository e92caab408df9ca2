// Command quickstart shows queen end to end. With QUEEN_DATABASE_URL set it
// uses that database; otherwise it starts a throwaway PostgreSQL cluster from
// the locally installed binaries and removes it when done.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	url, stop, started, err := pgcluster.URLFromEnv(ctx, "QUEEN_DATABASE_URL", pgcluster.Options{})
	if err != nil {
		return err
	}
	if started {
		fmt.Println("QUEEN_DATABASE_URL is not set: started a throwaway PostgreSQL cluster")
		defer fmt.Println("stopped the throwaway cluster")
	}
	defer stop()

	client, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: "quickstart"})
	if err != nil {
		return err
	}
	defer client.Close(context.Background())
	fmt.Println("opened queen; schema migrated")

	orders := client.Queue("orders")
	if err := orders.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		return err
	}
	results, err := orders.Push(ctx, []queen.Item{
		{Partition: "customer-1", TransactionID: "order-1001", Data: []byte(`{"sku":"tea","qty":2}`)},
		{Partition: "customer-1", TransactionID: "order-1002", Data: []byte(`{"sku":"cup","qty":1}`)},
		{Partition: "customer-2", TransactionID: "order-2001", Data: []byte(`{"sku":"pot","qty":1}`)},
		{Partition: "customer-1", TransactionID: "order-1001", Data: []byte(`{"sku":"tea","qty":2}`)}, // a retry
	})
	if err != nil {
		return err
	}
	for _, r := range results {
		fmt.Printf("push %-10s %-9s partition=%s offset=%d id=%s\n", r.TransactionID, r.Status, r.Partition, r.Offset, r.MessageID)
	}

	// Pushing the same transaction id again inside the dedup window is
	// reported as a duplicate of the original.
	again, err := orders.Push(ctx, []queen.Item{{Partition: "customer-2", TransactionID: "order-2001"}})
	if err != nil {
		return err
	}
	fmt.Printf("re-push %s: %s of %s\n", again[0].TransactionID, again[0].Status, again[0].MessageID)

	// Pop customer-1's messages under a lease and ack them: the ack commits
	// the partition's cursor, so they are not delivered again.
	msgs, err := orders.Pop(ctx, queen.PopOptions{Partition: "customer-1", Batch: 10})
	if err != nil {
		return err
	}
	for _, m := range msgs {
		fmt.Printf("pop  %-10s partition=%s offset=%d attempt=%d data=%s\n", m.TransactionID, m.Partition, m.Offset, m.Attempt, m.Data)
	}
	if len(msgs) > 0 {
		if err := msgs[len(msgs)-1].Ack(ctx); err != nil { // acks everything before it too
			return err
		}
		fmt.Printf("acked through offset %d\n", msgs[len(msgs)-1].Offset)
	}

	// Consume the rest with a handler; nil acks, an error would retry.
	cctx, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	err = orders.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, Wait: 200 * time.Millisecond}},
		func(_ context.Context, m *queen.Message) error {
			fmt.Printf("consumed %s from %s\n", m.TransactionID, m.Partition)
			if m.Partition == "customer-2" {
				stop() // nothing else is coming in this demo
			}
			return nil
		})
	if err != nil {
		return err
	}
	status, err := orders.Status(ctx)
	if err != nil {
		return err
	}
	for _, p := range status.Partitions {
		for _, g := range p.Groups {
			fmt.Printf("status %s: last offset %d, committed %d, lag %d\n", p.Name, p.LastOffset, g.Committed, g.Lag)
		}
	}

	st := client.Stats()
	fmt.Printf("engine: %d commits, %d segments, %d items\n", st.Commits, st.Segments, st.Items)
	return nil
}
