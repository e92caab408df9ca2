package queen_test

import (
	"fmt"
	"testing"

	"github.com/e03140bc/queen"
)

// The cache of queue settings is bounded: pushing to many queue names does
// not grow it past its bound, and it evicts the least recently used
// entries, so a queue in steady use stays cached.
func TestQueueMetaCacheIsBounded(t *testing.T) {
	const bound = 16
	c := open(t, queen.MetaCacheMax(bound))
	hot := c.Queue("hot")
	for i := range 100 {
		push(t, hot, queen.Item{Data: []byte("x")})
		push(t, c.Queue(fmt.Sprintf("q%03d", i)), queen.Item{Data: []byte("x")})
		if n := queen.MetaCacheLen(c); n > bound {
			t.Fatalf("after %d queue names the settings cache holds %d entries, bound %d", i+2, n, bound)
		}
		if !queen.MetaCached(c, "hot") {
			t.Fatalf("after %d queue names the queue used all along was evicted", i+2)
		}
	}
}
