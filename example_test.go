package queen_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// The Examples run under go test against the test binary's throwaway
// cluster. These helpers keep that plumbing out of their bodies, which
// read as user code.

// exampleURL is the database the Examples use. In an application it would
// be the service's own, e.g. os.Getenv("QUEEN_DATABASE_URL").
func exampleURL() string {
	url, err := pgtest.ExampleURL()
	if err != nil {
		// Printed so the Example's output mismatch says why.
		fmt.Println("no database:", err)
	}
	return url
}

// exampleSchema returns a fresh schema name, dropped (with the client's
// default spool directory) when the tests are done, so every Example starts
// from nothing and leaves nothing behind.
func exampleSchema() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails
	name := "example_" + hex.EncodeToString(b[:])
	pgtest.AtExit(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		url, err := pgtest.ExampleURL()
		if err != nil {
			return
		}
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			fmt.Fprintln(os.Stderr, "example cleanup:", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			fmt.Fprintln(os.Stderr, "example cleanup:", err)
		}
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "queen-spool-*"+name+"-*"))
		for _, d := range dirs {
			_ = os.RemoveAll(d)
		}
	})
	return name
}

// Open a client, push a message, pop it under a lease and ack it.
func Example() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	orders := client.Queue("orders") // created by its first push
	res, err := orders.Push(ctx, []queen.Item{
		{Partition: "customer-42", TransactionID: "order-1001", Data: []byte(`{"sku":"tea"}`)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res[0].Status, res[0].Partition, res[0].Offset)

	msgs, err := orders.Pop(ctx, queen.PopOptions{Batch: 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range msgs {
		fmt.Println(m.TransactionID, string(m.Data), "attempt", m.Attempt)
		if err := m.Ack(ctx); err != nil {
			fmt.Println(err)
		}
	}

	// Acked: nothing is left for queue mode.
	msgs, _ = orders.Pop(ctx, queen.PopOptions{})
	fmt.Println(len(msgs), "left")
	// Output:
	// queued customer-42 0
	// order-1001 {"sku":"tea"} attempt 1
	// 0 left
}

// Consume hands messages to a handler until its context ends: nil acks the
// message, an error fails it. Each partition is handled in offset order.
func ExampleQueue_Consume() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	orders := client.Queue("orders")
	var items []queen.Item
	for i := 1; i <= 3; i++ {
		items = append(items, queen.Item{Partition: "customer-42", Data: fmt.Appendf(nil, "order %d", i)})
	}
	if _, err := orders.Push(ctx, items); err != nil {
		fmt.Println(err)
		return
	}

	// Here the handler stops Consume after the third message; a service
	// would cancel on SIGTERM instead (see the graceful shutdown example).
	cctx, stop := context.WithCancel(ctx)
	var handled atomic.Int32 // handlers of different partitions run at once
	err = orders.Consume(cctx, queen.ConsumeOptions{
		PopOptions:  queen.PopOptions{Group: "billing", Batch: 100},
		Concurrency: 4, // partitions in parallel
	}, func(ctx context.Context, m *queen.Message) error {
		fmt.Println(m.Partition, m.Offset, string(m.Data))
		if handled.Add(1) == 3 {
			stop()
		}
		return nil // ack
	})
	fmt.Println("Consume returned", err)

	st, _ := orders.Status(ctx)
	g := st.Partitions[0].Groups[0]
	fmt.Printf("group %s: committed %d, lag %d\n", g.Group, g.Committed, g.Lag)
	// Output:
	// customer-42 0 order 1
	// customer-42 1 order 2
	// customer-42 2 order 3
	// Consume returned <nil>
	// group billing: committed 2, lag 0
}

// Client.Tx acks a message and pushes its follow-up atomically: either both
// happen or neither does.
func ExampleClient_Tx() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	orders, shipping := client.Queue("orders"), client.Queue("shipping")
	if _, err := orders.Push(ctx, []queen.Item{{TransactionID: "order-7", Data: []byte("paid")}}); err != nil {
		fmt.Println(err)
		return
	}
	msgs, err := orders.Pop(ctx, queen.PopOptions{})
	if err != nil || len(msgs) != 1 {
		fmt.Println(len(msgs), err)
		return
	}
	m := msgs[0]

	err = client.Tx(ctx, func(tx *queen.Tx) error {
		tx.Ack(m)
		tx.Push("shipping", []queen.Item{{TransactionID: "ship-" + m.TransactionID, Data: []byte("ship it")}})
		return nil
	})
	fmt.Println("tx:", err)

	left, _ := orders.Pop(ctx, queen.PopOptions{})
	next, _ := shipping.Pop(ctx, queen.PopOptions{AutoAck: true})
	fmt.Println("orders left:", len(left))
	fmt.Println("shipping:", next[0].TransactionID, string(next[0].Data))
	// Output:
	// tx: <nil>
	// orders left: 0
	// shipping: ship-order-7 ship it
}

// PushTx is the outbox pattern: your business row and the message commit in
// one transaction of yours, so the message exists if and only if the row
// does.
func ExampleQueue_PushTx() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	// The application's own table (in its own schema).
	shop := exampleSchema()
	db := client.Pool() // or the application's pool on the same database
	if _, err := db.Exec(ctx, "CREATE SCHEMA "+shop+"; CREATE TABLE "+shop+".orders (id text PRIMARY KEY, sku text)"); err != nil {
		fmt.Println(err)
		return
	}
	events := client.Queue("order-events")

	placeOrder := func(id, sku string, commit bool) error {
		tx, err := db.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // a no-op after Commit
		if _, err := tx.Exec(ctx, "INSERT INTO "+shop+".orders (id, sku) VALUES ($1, $2)", id, sku); err != nil {
			return err
		}
		if _, err := events.PushTx(ctx, tx, []queen.Item{{TransactionID: "placed:" + id, Data: []byte(sku)}}); err != nil {
			return err
		}
		if !commit {
			return nil // rolled back: neither the row nor the message exists
		}
		return tx.Commit(ctx)
	}
	if err := placeOrder("o-1", "tea", true); err != nil {
		fmt.Println(err)
	}
	if err := placeOrder("o-2", "coffee", false); err != nil {
		fmt.Println(err)
	}

	var rows int
	_ = db.QueryRow(ctx, "SELECT count(*) FROM "+shop+".orders").Scan(&rows)
	msgs, _ := events.Pop(ctx, queen.PopOptions{Batch: 10, AutoAck: true})
	fmt.Println("orders:", rows)
	for _, m := range msgs {
		fmt.Println("event:", m.TransactionID, string(m.Data))
	}
	// Output:
	// orders: 1
	// event: placed:o-1 tea
}

// With a DedupWindow, a push repeating a transaction id stored within the
// window is reported Duplicate with the original message's id, and is not
// stored again: a producer can retry after a timeout without doubling.
func ExampleQueueOptions_dedup() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	payments := client.Queue("payments")
	if err := payments.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		fmt.Println(err)
		return
	}
	// Name the effect, not the entity: "charge:invoice-9" stays a
	// duplicate of itself, while a later "refund:invoice-9" is new.
	first, _ := payments.Push(ctx, []queen.Item{{TransactionID: "charge:invoice-9", Data: []byte("100 EUR")}})
	again, _ := payments.Push(ctx, []queen.Item{{TransactionID: "charge:invoice-9", Data: []byte("100 EUR")}})
	fmt.Println(first[0].Status, again[0].Status)
	fmt.Println("same message:", again[0].MessageID == first[0].MessageID)

	msgs, _ := payments.Pop(ctx, queen.PopOptions{Batch: 10, AutoAck: true})
	fmt.Println("stored:", len(msgs))
	// Output:
	// queued duplicate
	// same message: true
	// stored: 1
}

// RetryLimit is how many failures a message gets: each Fail before the last
// redelivers it (Attempt counts up) while the later messages of its
// partition wait, and the RetryLimit-th failure moves it to the
// dead-letter store (DeadLetter: true) so its partition goes on.
func ExampleQueueOptions_retryLimit() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	jobs := client.Queue("jobs")
	// A failed message comes back after its RetryBackoff (here 100-200ms),
	// and job-2, behind it in the same partition, waits for it.
	if err := jobs.Configure(ctx, queen.QueueOptions{RetryLimit: 2, DeadLetter: true,
		RetryBackoff: queen.RetryBackoff{Min: 100 * time.Millisecond}}); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := jobs.Push(ctx, []queen.Item{
		{TransactionID: "job-1", Data: []byte("poison")},
		{TransactionID: "job-2", Data: []byte("fine")},
	}); err != nil {
		fmt.Println(err)
		return
	}

	for {
		msgs, err := jobs.Pop(ctx, queen.PopOptions{Wait: time.Second})
		if err != nil || len(msgs) == 0 {
			break
		}
		m := msgs[0]
		if string(m.Data) == "poison" {
			fmt.Println("fail", m.TransactionID, "attempt", m.Attempt)
			_ = m.Fail(ctx, errors.New("cannot parse"))
			continue
		}
		fmt.Println("ack", m.TransactionID, "attempt", m.Attempt)
		_ = m.Ack(ctx)
	}

	dead, _ := jobs.DeadLetters(ctx, queen.DeadLetterQuery{})
	for _, d := range dead {
		fmt.Println("dead:", d.TransactionID, d.Attempts, d.Reason)
	}
	// Output:
	// fail job-1 attempt 1
	// fail job-1 attempt 2
	// ack job-2 attempt 1
	// dead: job-1 2 cannot parse
}

// A message that can never succeed can be dead-lettered at once; the dead
// letters keep a snapshot of it, listed in pages.
func ExampleQueue_DeadLetters() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	imports := client.Queue("imports")
	if _, err := imports.Push(ctx, []queen.Item{
		{Partition: "tenant-1", Data: []byte("not json")},
		{Partition: "tenant-2", Data: []byte("{}")},
	}); err != nil {
		fmt.Println(err)
		return
	}
	msgs, _ := imports.Pop(ctx, queen.PopOptions{Batch: 10, Partitions: 2})
	for _, m := range msgs {
		if string(m.Data) == "not json" {
			_ = m.DeadLetter(ctx, errors.New("malformed payload"))
		} else {
			_ = m.Ack(ctx)
		}
	}

	var after int64
	for {
		page, err := imports.DeadLetters(ctx, queen.DeadLetterQuery{After: after, Limit: 100})
		if err != nil || len(page) == 0 {
			break
		}
		for _, d := range page {
			fmt.Printf("%s offset %d: %q (%s)\n", d.Partition, d.Offset, d.Data, d.Reason)
		}
		after = page[len(page)-1].ID
	}
	// Output:
	// tenant-1 offset 0: "not json" (malformed payload)
}

// Keyed lanes keep order per key without a partition per key, and
// KeyConcurrency handles different keys of one partition in parallel while
// each key's messages stay in order.
func ExampleConsumeOptions_keyConcurrency() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: exampleURL(), Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close(ctx)

	files := client.Queue("file-events")
	if err := files.Configure(ctx, queen.QueueOptions{Lanes: 1}); err != nil { // one lane: every key shares it
		fmt.Println(err)
		return
	}
	var items []queen.Item
	for _, ev := range []string{"created", "modified", "deleted"} {
		for _, file := range []string{"a.txt", "b.txt", "c.txt"} {
			items = append(items, queen.Item{Key: file, Data: []byte(ev)})
		}
	}
	res, err := files.Push(ctx, items)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("lane:", res[0].Partition)

	var mu sync.Mutex
	seen := map[string][]string{}
	cctx, stop := context.WithCancel(ctx)
	err = files.Consume(cctx, queen.ConsumeOptions{
		PopOptions:     queen.PopOptions{Batch: 100},
		KeyConcurrency: 3, // up to three keys at once, each in order
	}, func(ctx context.Context, m *queen.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen[m.Key] = append(seen[m.Key], string(m.Data))
		if n := len(seen["a.txt"]) + len(seen["b.txt"]) + len(seen["c.txt"]); n == len(items) {
			stop()
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Println(k, strings.Join(seen[k], " → "))
	}
	// Output:
	// lane: lane-0
	// a.txt created → modified → deleted
	// b.txt created → modified → deleted
	// c.txt created → modified → deleted
}
