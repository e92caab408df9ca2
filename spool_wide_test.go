package queen_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// A push to many partitions during an outage is Buffered within about
// StatementTimeout even when each spool write is slow: its partitions are
// not spooled one write (one fsync) after another.
func TestPushToManyPartitionsDuringOutageBuffersWithinStatementTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	const (
		timeout = 2 * time.Second
		parts   = 120
		delay   = 50 * time.Millisecond // parts writes of it: 6s
	)
	bound := timeout + time.Second
	cl := pgtest.NewCluster(t, pgcluster.Options{})
	slowDisk, appends := queen.SpoolAppendDelay(delay)
	c := open(t, slowDisk, func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Schema = cl.URL, "wide"
		cfg.StatementTimeout, cfg.EncryptionKey = timeout, make([]byte, 32)
	})
	seen := c.Queue("seen")
	push(t, seen, queen.Item{Partition: "p0", Data: []byte("before")})
	if err := cl.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []*queen.Queue{seen, c.Queue("never")} {
		items := make([]queen.Item, parts)
		for i := range items {
			items[i] = queen.Item{Partition: fmt.Sprintf("p%d", i), Data: []byte("x")}
		}
		before := appends()
		res, took, err := pushTimed(t, q, time.Minute, items...)
		if err != nil {
			t.Fatalf("push to %q: %v (after %s)", q.Name(), err, took)
		}
		for i, r := range res {
			if r.Status != queen.Buffered {
				t.Fatalf("push to %q: item %d: %+v, want Buffered", q.Name(), i, r)
			}
		}
		t.Logf("push to %q of %d partitions Buffered after %s in %d spool writes", q.Name(), parts, took, appends()-before)
		if took > bound {
			t.Errorf("push to %q of %d partitions took %s in %d spool writes, want at most %s", q.Name(), parts, took, appends()-before, bound)
		}
	}
}
