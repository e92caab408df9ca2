package queen_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// A client keeps a partly read segment decompressed between pops. When the
// database's copy of the partition is replaced under it (a restore from an
// older backup, a failover to a replica that lost the latest commits), the
// same partition id and base offset name a different segment: the client
// must serve the new segment's messages, not its cached frames.
func TestPopSegmentCacheNotServedForReplacedSegment(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "p", "old", 2) // one segment, offsets 0-1
	msgs := pop(t, q, queen.PopOptions{Partition: "p"})
	wantData(t, msgs, "old0") // read part of the segment: now cached
	ack(t, msgs[0])

	// The partition as a restore to before those pushes leaves it.
	s := func(table string) string { return pgx.Identifier{c.Schema(), table}.Sanitize() }
	for _, sql := range []string{
		"DELETE FROM " + s("segments"),
		"DELETE FROM " + s("txns"),
		"UPDATE " + s("partitions") + " SET last_offset = -1, log_start = 0, txns_start = 0, pending = true",
		"UPDATE " + s("consumers") + ` SET committed = -1, batch_end = NULL, lease_id = NULL, lease_owner = NULL,
			lease_expires_at = NULL, attempts = 0, deliveries = 0, delivered_max = -1`,
	} {
		if _, err := c.Pool().Exec(ctxT(t), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if r := pushN(t, q, "p", "new", 2); r[0].Offset != 0 {
		t.Fatalf("re-pushed at offset %d, want 0", r[0].Offset)
	}
	for i, want := range []string{"new0", "new1"} {
		msgs := pop(t, q, queen.PopOptions{Partition: "p"})
		wantData(t, msgs, want)
		if msgs[0].Offset != int64(i) {
			t.Fatalf("%s at offset %d, want %d", want, msgs[0].Offset, i)
		}
		ack(t, msgs[0])
	}
}
