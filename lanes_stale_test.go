package queen_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/zeebo/xxh3"

	"github.com/e03140bc/queen"
)

// laneName is the lane QueueOptions.Lanes documents for key.
func laneName(key string, lanes int) string {
	return fmt.Sprintf("lane-%d", xxh3.HashString(key)%uint64(lanes))
}

// keysSharingLaneOnlyUnder returns two keys in one lane of stale lanes and
// in two lanes of fresh.
func keysSharingLaneOnlyUnder(t testing.TB, stale, fresh int) (string, string) {
	t.Helper()
	first := map[string]string{}
	for i := range 100000 {
		k := fmt.Sprintf("key-%d", i)
		l := laneName(k, stale)
		o, ok := first[l]
		if !ok {
			first[l] = k
		} else if laneName(o, fresh) != laneName(k, fresh) {
			return o, k
		}
	}
	t.Fatal("no two keys found")
	return "", ""
}

// Two items of one call with one TransactionID whose keys share a lane only
// under a client's stale lane count are not one message: once the database
// sends the call back, each is stored in its own lane under the queue's
// count, and neither is reported a Duplicate of a lane that does not hold
// its id.
func TestLanesStaleCacheSameTxnKeysSplit(t *testing.T) {
	for _, via := range []string{"Push", "PushTx"} {
		t.Run(via, func(t *testing.T) {
			c1, c2, _ := openPair(t)
			ctx := ctxT(t)
			q1 := c1.Queue("q")
			push(t, q1, queen.Item{Data: []byte("warm")}) // c1 caches 64 lanes
			configure(t, c2, "q", queen.QueueOptions{Lanes: 5})
			k1, k2 := keysSharingLaneOnlyUnder(t, queen.DefaultLanes, 5)
			items := []queen.Item{
				{Data: []byte("a"), Key: k1, TransactionID: "T"},
				{Data: []byte("b"), Key: k2, TransactionID: "T"},
			}
			var res []queen.PushResult
			switch via {
			case "Push":
				res = push(t, q1, items...)
			case "PushTx":
				err := pgx.BeginFunc(ctx, c1.Pool(), func(tx pgx.Tx) error {
					var err error
					res, err = q1.PushTx(ctx, tx, items)
					return err
				})
				if err != nil {
					t.Fatalf("PushTx: %v", err)
				}
			}
			for i, r := range res {
				lane := laneName(items[i].Key, 5)
				if r.Partition != lane {
					t.Errorf("item %d (key %q): reported in %q, want %q", i, items[i].Key, r.Partition, lane)
				}
				found := false
				for _, f := range storedFrames(t, c2, lane) {
					if f.ID == r.MessageID && f.Key == items[i].Key {
						found = true
					}
				}
				if !found {
					t.Errorf("item %d (key %q): %s as %s, but %s holds no such message", i, items[i].Key, r.Status, r.MessageID, lane)
				}
			}
			msgs := pop(t, c2.Queue("q"), queen.PopOptions{Batch: 10, Partitions: 10, AutoAck: true})
			wantKeys(t, msgs, map[string]string{"warm": "", "a": k1, "b": k2})
		})
	}
}
