package queentest_test

import (
	"context"
	"testing"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest"
)

// A test of code that pushes and handles orders, on a real PostgreSQL. In
// your package's _test.go file, TestMain calls queentest.Main (one
// throwaway cluster for the whole test binary) and each test opens a client
// on a fresh schema. Examples have no *testing.T, so this one only shows
// the shape of such a test.
func ExampleRequirePushed() {
	testOrders := func(t *testing.T) {
		ctx := t.Context()
		c := queentest.Open(t) // a fresh schema, dropped when the test ends
		q := c.Queue("orders")

		// The code under test pushes.
		if _, err := q.Push(ctx, []queen.Item{
			{Partition: "customer-1", TransactionID: "order-1", Data: []byte(`{"qty":2}`)},
			{Partition: "customer-2", TransactionID: "order-2", Data: []byte(`{"qty":1}`)},
		}); err != nil {
			t.Fatal(err)
		}

		// Per partition: the two expectations could come in either order.
		queentest.RequirePushed(ctx, t, q,
			queentest.Expected{Partition: "customer-2", TransactionID: "order-2"},
			queentest.Expected{Partition: "customer-1", TransactionID: "order-1", Data: []byte(`{"qty":2}`)})

		// The handler under test, as the billing group would run it.
		r := queentest.WorkWith(ctx, t, q, queentest.WorkOptions{Group: "billing"},
			func(ctx context.Context, m *queen.Message) error { return nil })
		if r.Outcome != queentest.Acked {
			t.Fatalf("handler: %v", r.Err)
		}
	}
	_ = testOrders
}
