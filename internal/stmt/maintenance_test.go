package stmt_test

import (
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/stmt"
)

// An empty partition unwritten for longer than Idle is in the window, due
// only for the idle purge, and purged by it; the steps find nothing else
// to do.
func TestMaintenanceStatements(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := stmt.New(schema)
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	var pid int64
	if err := pool.QueryRow(ctx, "WITH q AS (INSERT INTO "+tbl("queues")+" (tenant, name) VALUES ($1, 'q') RETURNING id) "+
		"INSERT INTO "+tbl("partitions")+" (id, queue_id, name, last_write_at) SELECT "+tbl("partition_key")+"(id, 'p', 0), id, 'p', now() - interval '1 hour' FROM q RETURNING id",
		uuid.Must(uuid.NewV4())).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	window, err := stmt.MaintenanceWindow(ctx, s, pool, 0, 10)
	if err != nil || len(window) != 1 || window[0] != pid {
		t.Fatalf("window: %v, %v", window, err)
	}
	due, err := stmt.MaintenanceDue(ctx, s, pool, stmt.MaintenanceDueParams{Partitions: window, HashFloor: time.Minute, Idle: time.Minute})
	// Hash rows stay the longest of the floor, the dedup window and the
	// lease time (the queue's default).
	if err != nil || len(due) != 1 || due[0].HashKeep < time.Minute ||
		due[0] != (stmt.MaintenanceDueRow{Partition: pid, HashKeep: due[0].HashKeep, Idle: true}) {
		t.Fatalf("due: %+v, %v", due, err)
	}
	if n, err := stmt.RetentionStep(ctx, s, pool, pid, 10, time.Hour); err != nil || n != 0 {
		t.Fatalf("retention step: %d, %v", n, err)
	}
	if n, err := stmt.PurgeTxnsStep(ctx, s, pool, pid, due[0].HashKeep, 10); err != nil || n != 0 {
		t.Fatalf("hash purge step: %d, %v", n, err)
	}
	if lag, err := stmt.LagByGroup(ctx, s, pool, false); err != nil || len(lag) != 0 {
		t.Fatalf("lag: %+v, %v", lag, err)
	}
	if gone, err := stmt.PurgePartition(ctx, s, pool, pid, time.Minute); err != nil || !gone {
		t.Fatalf("purge partition: %v, %v", gone, err)
	}
	if window, err := stmt.MaintenanceWindow(ctx, s, pool, 0, 10); err != nil || len(window) != 0 {
		t.Fatalf("window after the purge: %v, %v", window, err)
	}
}
