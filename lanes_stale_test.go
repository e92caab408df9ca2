package queen_test

import (
	"fmt"
	"testing"
	"time"

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
			msgs := popToEmpty(t, c2.Queue("q"), queen.PopOptions{Batch: 10, Partitions: 10})
			wantKeys(t, msgs, map[string]string{"warm": "", "a": k1, "b": k2})
		})
	}
}

// A keyed push spooled under a stale lane count (its lane under the count
// the client knew) is not overtaken by a later push of the same key to its
// lane under the queue's count: the key's messages are stored in push
// order, both in the lane the queue's count gives.
func TestLanesChangeSpooledKeyNotOvertaken(t *testing.T) {
	c1, c2, _ := openPair(t, manual, func(c *queen.Config) { c.StatementTimeout = lockTimeout })
	const key = "customer-42"
	stale, fresh := laneName(key, queen.DefaultLanes), laneName(key, 8)
	q1 := c1.Queue("q")
	push(t, q1, queen.Item{Partition: stale, TransactionID: "warm"}) // c1 caches 64 lanes; stale exists
	configure(t, c2, "q", queen.QueueOptions{Lanes: 8})
	release := lockPartition(t, c1, stale)
	if r := push(t, q1, queen.Item{Key: key, TransactionID: "m1"})[0]; r.Status != queen.Buffered || r.Partition != stale {
		t.Fatalf("%+v, want Buffered to %s", r, stale)
	}
	// Let the drain fail on the lock, so that it is backing off (for 800ms)
	// when the next push comes.
	waitFor(t, time.Minute, "failed drain passes", func() bool { return c1.SpoolStats().DrainFailures >= 4 })
	release()
	queen.ForgetQueueMeta(c1, "q") // c1 reads 8 lanes now
	r := push(t, q1, queen.Item{Key: key, TransactionID: "m2"})[0]
	t.Logf("m2: %s to %s", r.Status, r.Partition)
	waitFor(t, 20*time.Second, "the drain", func() bool { return c1.SpoolStats().PendingRecords == 0 })
	if got := txnIDs(storedFrames(t, c1, fresh)); fmt.Sprint(got) != "[m1 m2]" {
		t.Fatalf("%s holds %v, want [m1 m2]", fresh, got)
	}
	if got := txnIDs(storedFrames(t, c1, stale)); fmt.Sprint(got) != "[warm]" {
		t.Fatalf("%s holds %v, want [warm]", stale, got)
	}
}
