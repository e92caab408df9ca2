package queen_test

import (
	"context"
	"fmt"
	"time"

	"github.com/e03140bc/queen"
)

// Schedule a reminder for later with Item.DeliverAt, and cancel another
// before it is due. A pop before the due time finds nothing; the reminder
// arrives once it is due.
func Example_deliverAt() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	reminders := client.Queue("reminders")
	due := time.Now().Add(500 * time.Millisecond)
	res, err := reminders.Push(ctx, []queen.Item{
		{TransactionID: "remind-42", Data: []byte("call Ada back"), DeliverAt: due},
		{TransactionID: "remind-43", Data: []byte("never mind"), DeliverAt: due},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res[0].Status, res[1].Status)

	n, err := reminders.CancelScheduled(ctx, []string{"remind-43"})
	fmt.Println("cancelled:", n, err)

	early, _ := reminders.Pop(ctx, queen.PopOptions{AutoAck: true})
	fmt.Println("before its time:", len(early))

	// Wait long-polls until the mover appends the reminder.
	for {
		msgs, err := reminders.Pop(ctx, queen.PopOptions{AutoAck: true, Wait: 5 * time.Second})
		if err != nil {
			fmt.Println(err)
			return
		}
		if len(msgs) > 0 {
			fmt.Println(string(msgs[0].Data), "on time:", !time.Now().Before(due))
			return
		}
	}
	// Output:
	// scheduled scheduled
	// cancelled: 1 <nil>
	// before its time: 0
	// call Ada back on time: true
}
