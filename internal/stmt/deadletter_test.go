package stmt_test

import (
	"testing"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/stmt"
)

// DiscardDeadLetters deletes the page it selects; DeadLetterRetentionStep
// deletes dead letters past their queue's retention, at most maxRows, and
// leaves a queue without retention alone; DeadLetterCounts counts per
// queue, 0 included.
func TestDeadLetterStatements(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s, c := stmt.New(schema), stmt.NewConsume(schema)
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	tenant := uuid.Must(uuid.NewV4())
	add := func(queue string, retentionMs int64, ages ...string) {
		t.Helper()
		var qid int64
		if err := pool.QueryRow(ctx, "INSERT INTO "+tbl("queues")+" (tenant, name, dead_letter_retention_ms) VALUES ($1, $2, $3) RETURNING id",
			tenant, queue, retentionMs).Scan(&qid); err != nil {
			t.Fatal(err)
		}
		for _, age := range ages {
			if _, err := pool.Exec(ctx, "INSERT INTO "+tbl("dead_letters")+" (queue_id, partition_id, partition_name, group_name, msg_offset, "+
				"message_id, transaction_id, message_created_at, attempts, created_at) "+
				"VALUES ($1, 1, 'p', '', 0, gen_random_uuid(), 't', now(), 1, now() - $2::interval)", qid, age); err != nil {
				t.Fatal(err)
			}
		}
	}
	add("q", 60_000, "2 hours", "3 hours", "1 second", "4 hours")
	add("keep", 0, "5 hours")
	add("none", 60_000)
	for i, want := range []int{2, 1, 0} {
		if n, err := stmt.DeadLetterRetentionStep(ctx, s, pool, 2); err != nil || n != want {
			t.Fatalf("retention step %d: %d, %v; want %d", i, n, err, want)
		}
	}
	counts, err := stmt.DeadLetterCounts(ctx, s, pool)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, r := range counts {
		if r.Tenant != tenant {
			t.Fatalf("count row %+v of another tenant", r)
		}
		got[r.Queue] = r.DeadLetters
	}
	if len(got) != 3 || got["q"] != 1 || got["keep"] != 1 || got["none"] != 0 {
		t.Fatalf("counts %v", got)
	}
	page := stmt.DeadLetterPage{Queue: stmt.QueueRef{Tenant: tenant, Name: "keep"}, Limit: 10}
	if n, err := stmt.DiscardDeadLetters(ctx, c, pool, page); err != nil || n != 1 {
		t.Fatalf("discard: %d, %v", n, err)
	}
	if n, err := stmt.DiscardDeadLetters(ctx, c, pool, page); err != nil || n != 0 {
		t.Fatalf("discard again: %d, %v", n, err)
	}
}
