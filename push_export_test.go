package queen

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/alloc"
	"github.com/e03140bc/queen/dedup"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/spool"
)

// Every test of the package runs with recycled item slabs poisoned rather
// than cleared: an item read after its slab went back to the pool reads
// another message (and the race detector sees the write), and a verdict
// written to one after it lands in poisonResult, shared by all.
var (
	recycledSlabs atomic.Int64
	poisonResult  PushResult
	poisonPayload = []byte("poisoned payload")
)

func init() {
	slabPoison = func(slab []pushItem) {
		for i := range slab {
			slab[i] = pushItem{
				Frame: frame.Frame{ID: uuid.Max, TransactionID: "poisoned", Key: "poisoned", Payload: poisonPayload},
				hash:  dedup.Sum("poisoned"),
				lanes: 7,
				res:   &poisonResult,
			}
		}
		recycledSlabs.Add(1)
	}
}

// RecycledSlabs is how many item slabs pushes gave back for reuse.
func RecycledSlabs() int64 { return recycledSlabs.Load() }

// ExpireQueueMeta makes every cached queue setting of c's engine look older
// than its time to live, and forgets that a read failed recently, as if the
// cache had not been used for a while.
func ExpireQueueMeta(c *Client) { c.e.meta.Expire() }

// MetaCacheMax bounds the queue settings the client caches: an option for
// Open in tests.
func MetaCacheMax(n int) func(*Config) {
	return func(c *Config) { c.testKnobs().metaCacheMax = n }
}

// MetaCacheLen is the number of queue settings c's engine has cached.
func MetaCacheLen(c *Client) int { return c.e.meta.Len() }

// MetaCached reports whether c's engine has the queue's settings cached.
func MetaCached(c *Client, queue string) bool { return c.e.meta.Cached(c.tenant, queue) }

// FusionBufferedBytes is what c's push engine holds for unresolved pushes.
func FusionBufferedBytes(c *Client) int64 { return c.e.push.fusion.Stats().BufferedBytes }

// FusionInline is the number of push flushes c's engine ran on the pushing
// goroutine.
func FusionInline(c *Client) uint64 { return c.e.push.fusion.Stats().Inline }

// MaxBundleBytes sets the bound on one push_bundle call's frames: an
// option for Open in tests.
func MaxBundleBytes(n int) func(*Config) {
	return func(c *Config) { c.testKnobs().maxBundleBytes = n }
}

// Rerouted counts the items c's engine routed to a lane again because the
// lane count they were routed with was stale.
func Rerouted(c *Client) int64 { return c.e.push.rerouted.Load() }

// DueBundleSummary makes c's next flush log the bundle summary.
func DueBundleSummary(c *Client) {
	p := c.e.push
	p.sumMu.Lock()
	p.sumAt = time.Time{}
	p.sumMu.Unlock()
}

// ForgetQueueMeta drops c's cached settings of queue, and that a read
// failed recently: the next push reads them.
func ForgetQueueMeta(c *Client, queue string) {
	c.e.forgetMeta(c.tenant, queue)
	c.e.noteUp()
}

// SpoolAppendDelay makes every spool write of the client take d longer,
// like an fsync on a busy disk: an option for Open in tests, and a func
// counting the client's spool writes.
func SpoolAppendDelay(d time.Duration) (opt func(*Config), appends func() int64) {
	var n atomic.Int64
	return func(c *Config) {
		c.testKnobs().spoolAppend = func(s *spool.Spool, ctx context.Context, recs []spool.Record) error {
			n.Add(1)
			time.Sleep(d)
			return s.Append(ctx, recs)
		}
	}, n.Load
}

// ClaimKnown makes c's engine take the partition as one it has written to,
// as a hash collision with such a partition would.
func ClaimKnown(c *Client, queue, partition string) { ClaimKnownID(c, queue, partition, 0) }

// ClaimKnownID is ClaimKnown with the partition's id taken to be pid.
func ClaimKnownID(c *Client, queue, partition string, pid int64) {
	k := partitionKey{Tenant: c.tenant, Queue: queue, Partition: partition}
	c.e.push.known.add([]segPlan{{key: k.Hash()}}, []alloc.Verdict{{PartitionID: pid}})
}

// KnownID is the id c's engine holds for the partition, and whether it
// takes it as written to.
func KnownID(c *Client, queue, partition string) (int64, bool) {
	k := partitionKey{Tenant: c.tenant, Queue: queue, Partition: partition}
	return c.e.push.known.one(k.Hash())
}

// CachedQueueID is the queue's id as the client's settings cache holds it
// (0: not read, or not created when read).
func CachedQueueID(c *Client, queue string) int64 {
	m, _ := c.e.meta.Peek(c.tenant, queue)
	return m.ID
}
