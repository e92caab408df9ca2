package queen_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/e03140bc/queen"
)

// A queue's retry backoff: a failed message waits between attempts, here
// 200-400 ms after the first failure, 200-800 ms after the second; the
// third failure dead-letters it. Its partition's later messages wait with
// it (FailurePause); other partitions flow meanwhile.
func ExampleRetryBackoff() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	webhooks := client.Queue("webhooks")
	if err := webhooks.Configure(ctx, queen.QueueOptions{RetryLimit: 3, DeadLetter: true,
		RetryBackoff: queen.RetryBackoff{Min: 200 * time.Millisecond, Max: 800 * time.Millisecond}}); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := webhooks.Push(ctx, []queen.Item{{TransactionID: "hook-1"}}); err != nil {
		fmt.Println(err)
		return
	}
	last := time.Now()
	for {
		msgs, err := webhooks.Pop(ctx, queen.PopOptions{Wait: 2 * time.Second})
		if err != nil || len(msgs) == 0 {
			break
		}
		m := msgs[0]
		fmt.Printf("attempt %d, waited at least 200ms: %v\n", m.Attempt, m.Attempt == 1 || time.Since(last) >= 200*time.Millisecond)
		_ = m.Fail(ctx, errors.New("endpoint down"))
		last = time.Now()
	}
	dead, _ := webhooks.DeadLetters(ctx, queen.DeadLetterQuery{})
	fmt.Println("dead letters:", len(dead))
	// Output:
	// attempt 1, waited at least 200ms: true
	// attempt 2, waited at least 200ms: true
	// attempt 3, waited at least 200ms: true
	// dead letters: 1
}

// A handler told by its downstream when to come back (an HTTP 429 with
// Retry-After) returns RetryAfter: the message waits that long instead of
// the queue's RetryBackoff, and the failure is charged as any other.
func ExampleRetryAfter() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(context.Background())

	calls := client.Queue("api-calls")
	if _, err := calls.Push(ctx, []queen.Item{{TransactionID: "call-1"}}); err != nil {
		fmt.Println(err)
		return
	}
	var throttledAt time.Time
	err = calls.Consume(ctx, queen.ConsumeOptions{}, func(_ context.Context, m *queen.Message) error {
		if m.Attempt == 1 {
			throttledAt = time.Now()
			fmt.Println("attempt 1: 429, Retry-After 300ms")
			return queen.RetryAfter(300*time.Millisecond, errors.New("429 Too Many Requests"))
		}
		fmt.Printf("attempt %d after at least 300ms: %v\n", m.Attempt, time.Since(throttledAt) >= 300*time.Millisecond)
		cancel()
		return nil
	})
	fmt.Println("Consume returned", err)
	// Output:
	// attempt 1: 429, Retry-After 300ms
	// attempt 2 after at least 300ms: true
	// Consume returned <nil>
}

// Message.RetryAfter is the same for a Pop user: a charged failure whose
// next attempt is not before d from now. Status shows when.
func ExampleMessage_RetryAfter() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	reports := client.Queue("reports")
	if _, err := reports.Push(ctx, []queen.Item{{Partition: "tenant-7", TransactionID: "report-1"}}); err != nil {
		fmt.Println(err)
		return
	}
	msgs, _ := reports.Pop(ctx, queen.PopOptions{})
	if err := msgs[0].RetryAfter(ctx, time.Minute); err != nil {
		fmt.Println(err)
		return
	}
	st, _ := reports.Status(ctx)
	g := st.Partitions[0].Groups[0]
	fmt.Println("failures:", g.Failures, "leased:", g.Leased, "waits about a minute:", time.Until(g.RetryAt) > 55*time.Second)
	again, _ := reports.Pop(ctx, queen.PopOptions{})
	fmt.Println("delivered before then:", len(again))
	// Output:
	// failures: 1 leased: false waits about a minute: true
	// delivered before then: 0
}
