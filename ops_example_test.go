package queen_test

import (
	"context"
	"fmt"

	"github.com/e03140bc/queen"
)

// Pause a consumer group during a downstream incident: its pops find
// nothing (its Consume idles) while pushes still land, in every process;
// Resume hands it everything that arrived meanwhile.
func ExampleQueue_Pause() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	emails := client.Queue("emails")
	if err := emails.Pause(ctx, "sender"); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := emails.Push(ctx, []queen.Item{{Data: []byte("welcome, Ada")}}); err != nil {
		fmt.Println(err)
		return
	}
	msgs, _ := emails.Pop(ctx, queen.PopOptions{Group: "sender", AutoAck: true})
	fmt.Println("while paused:", len(msgs))

	if err := emails.Resume(ctx, "sender"); err != nil {
		fmt.Println(err)
		return
	}
	msgs, _ = emails.Pop(ctx, queen.PopOptions{Group: "sender", AutoAck: true})
	for _, m := range msgs {
		fmt.Println("after resume:", string(m.Data))
	}
	// Output:
	// while paused: 0
	// after resume: welcome, Ada
}

// Peek shows what a queue holds without leasing anything or moving a
// cursor: partitions in byte order of their names, each in offset order,
// consumed messages included while they are retained.
func ExampleQueue_Peek() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	orders := client.Queue("orders")
	_, err = orders.Push(ctx, []queen.Item{
		{Partition: "customer-7", Data: []byte("tea")},
		{Partition: "customer-3", Data: []byte("cake")},
		{Partition: "customer-7", Data: []byte("milk")},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Consumed in queue mode, yet still there to peek at.
	if _, err := orders.Pop(ctx, queen.PopOptions{Partition: "customer-3", AutoAck: true}); err != nil {
		fmt.Println(err)
		return
	}

	msgs, err := orders.Peek(ctx, queen.PeekOptions{Limit: 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range msgs {
		fmt.Println(m.Partition, m.Offset, string(m.Data))
	}
	// Nothing was leased: a pop still gets the first message on its first
	// attempt.
	next, _ := orders.Pop(ctx, queen.PopOptions{Partition: "customer-7"})
	fmt.Println("next:", string(next[0].Data), "attempt", next[0].Attempt)
	// Output:
	// customer-3 0 cake
	// customer-7 0 tea
	// customer-7 1 milk
	// next: tea attempt 1
}
