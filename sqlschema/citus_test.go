package sqlschema_test

import (
	"errors"
	"testing"

	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/sqlschema"
)

// On plain PostgreSQL, Distribute refuses and changes nothing; Distributed
// says no. (On Citus: TestOnCitus in the root package.)
func TestDistributeWithoutCitus(t *testing.T) {
	pool, schema := pgtest.Migrated(t)
	ctx := t.Context()
	if err := sqlschema.Distribute(ctx, pool, schema); !errors.Is(err, sqlschema.ErrNoCitus) {
		t.Fatalf("Distribute = %v, want ErrNoCitus", err)
	}
	if ok, err := sqlschema.Distributed(ctx, pool, schema); ok || err != nil {
		t.Fatalf("Distributed = %v, %v; want false", ok, err)
	}
	var unique bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'partitions_queue_name_key' AND connamespace = $1::regnamespace)",
		schema).Scan(&unique); err != nil || !unique {
		t.Fatalf("partitions' unique (queue_id, name) after a refused Distribute: %v, %v", unique, err)
	}
}
