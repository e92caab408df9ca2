package sqlschema

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoCitus is returned by [Distribute] for a database without the citus
// extension.
var ErrNoCitus = errors.New("queen: the citus extension is not installed in this database")

// The Citus layout (see DESIGN.md, "On Citus"): the per-partition tables
// are distributed by partition id and co-located with partitions, so every
// row of one partition lives on one worker; the per-queue and per-schema
// tables are reference tables (a copy on every node); the two version
// tables stay on the coordinator.
var (
	// CitusDistributed are the tables distributed by partition id, in the
	// order they are distributed (partitions first: the others co-locate
	// with it).
	CitusDistributed = []string{"partitions", "segments", "txns", "consumers", "backlog"}
	// CitusReference are the tables replicated to every node.
	CitusReference = []string{"queues", "subscriptions", "dead_letters", "paused_groups",
		"scheduled", "samples", "settings", "samples_clock"}
	// CitusCoordinator are the tables that stay plain tables of the
	// coordinator, outside Citus's metadata: members, whose heartbeats ride
	// on claims, which as a reference table would make every heartbeat a
	// two-phase commit over every node (and a claim that carried one a
	// multi-node transaction). Without a foreign key to queues (Citus would
	// convert the table into a "Citus local" one, whose writes beside a
	// worker's are two-phase as well): the rows of a deleted queue are
	// no one's (readers join queues) and expire with their member TTL.
	CitusCoordinator = []string{"members"}
	// CitusLocal are the tables Citus keeps on the coordinator as "Citus
	// local" tables: the scheduled generations, a partitioned table
	// (which Citus does not replicate) with a foreign key to queues. Their
	// state tables (scheduled_state, scheduled_gens) stay plain tables of
	// the coordinator: as reference tables every move's lock on the state
	// row would be a two-phase commit.
	CitusLocal = []string{"scheduled_gen"}
)

// queueFKs are the foreign keys to queues, dropped while the tables are
// converted and added back after: Citus converts a local table that
// references a reference table into a "Citus local" table, which it then
// refuses to distribute (identity columns).
var queueFKs = []string{"partitions", "subscriptions", "dead_letters", "paused_groups",
	"scheduled", "samples"}

// distributeSQL are the statements that convert a migrated schema to the
// Citus layout, run in one transaction. The unique (queue_id, name) of
// partitions cannot stay: Citus enforces only constraints that include the
// distribution column. The primary key takes its place: a partition's id
// is derived from (queue_id, name) (migration 016), so two creators of one
// partition insert the same key, and every creator goes through
// add_partition, which looks at both of the name's ids before inserting.
// A plain index keeps the lookups by name of partitions created before 016
// keyed.
func distributeSQL(schema string) []string {
	// Sequential: the later statements change tables distributed earlier in
	// the same transaction, which Citus refuses after a parallel one.
	s := []string{"SET LOCAL citus.multi_shard_modify_mode TO 'sequential'"}
	for _, t := range append(queueFKs, CitusCoordinator...) {
		s = append(s, fmt.Sprintf("ALTER TABLE {{schema}}.%s DROP CONSTRAINT %s_queue_id_fkey", t, t))
	}
	s = append(s, "ALTER TABLE {{schema}}.partitions DROP CONSTRAINT partitions_queue_name_key",
		"CREATE INDEX partitions_queue_name_idx ON {{schema}}.partitions (queue_id, name)",
		"SELECT create_distributed_table('{{schema}}.partitions', 'id')")
	for _, t := range CitusDistributed[1:] {
		s = append(s, fmt.Sprintf("SELECT create_distributed_table('{{schema}}.%s', 'partition_id', colocate_with => '{{schema}}.partitions')", t))
	}
	for _, t := range CitusReference {
		s = append(s, fmt.Sprintf("SELECT create_reference_table('{{schema}}.%s')", t))
	}
	// Citus copies a table's rows into its shards and leaves them in the
	// coordinator's table too, out of every query's sight: a second copy
	// of every message, on the coordinator's disk, until truncated.
	for _, t := range append(slices.Clone(CitusDistributed), CitusReference...) {
		s = append(s, fmt.Sprintf("SELECT truncate_local_data_after_distributing_table('{{schema}}.%s')", t))
	}
	// The function layer's statements go one partition at a time from now.
	s = append(s, "UPDATE {{schema}}.settings SET routed = true", customPlansSQL)
	for _, t := range queueFKs {
		s = append(s, fmt.Sprintf("ALTER TABLE {{schema}}.%s ADD CONSTRAINT %s_queue_id_fkey "+
			"FOREIGN KEY (queue_id) REFERENCES {{schema}}.queues (id) ON DELETE CASCADE", t, t))
	}
	for i := range s {
		s[i] = render(s[i], schema)
	}
	return s
}

// Distribute converts schema, migrated by [Migrate], to the Citus layout:
// partition-keyed tables distributed by partition id and co-located,
// per-queue and per-schema tables reference tables, members a plain table
// of the coordinator. pool must reach the Citus coordinator. It is
// idempotent (a schema already distributed is brought to today's layout,
// see relayout, and otherwise left as it is) and serialized with Migrate by
// the same advisory lock. It fails with ErrNoCitus where the citus
// extension is missing. README's "On Citus" says what the layout does not
// give.
func Distribute(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := ValidSchema(schema); err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("sqlschema: acquire: %w", err)
	}
	defer conn.Release()
	var citus bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')").Scan(&citus); err != nil {
		return fmt.Errorf("sqlschema: distribute: %w", err)
	}
	if !citus {
		return ErrNoCitus
	}
	key := lockKey(schema)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return fmt.Errorf("sqlschema: advisory lock: %w", err)
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", key); err != nil {
			_ = conn.Conn().Close(context.Background())
		}
	}()
	done, err := Distributed(ctx, pool, schema)
	if err != nil {
		return err
	}
	if done {
		return relayout(ctx, conn.Conn(), schema)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("sqlschema: distribute: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, q := range distributeSQL(schema) {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("sqlschema: distribute: %s: %w", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("sqlschema: distribute: %w", err)
	}
	return nil
}

// Distributed reports whether schema has the Citus layout (its partitions
// table is distributed). False on a database without Citus.
func Distributed(ctx context.Context, pool *pgxpool.Pool, schema string) (bool, error) {
	if err := ValidSchema(schema); err != nil {
		return false, err
	}
	var ok bool
	err := pool.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&ok)
	if err != nil || !ok {
		return false, err
	}
	err = pool.QueryRow(ctx, render(`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
		WHERE logicalrelid = to_regclass('{{schema}}.partitions'))`, schema)).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("sqlschema: distributed: %w", err)
	}
	return ok, nil
}

// relayout brings a schema distributed by an earlier release to today's
// layout: members, once a reference table, back to a plain table of the
// coordinator (see CitusCoordinator), and the rows an earlier Distribute
// left in the coordinator's tables truncated (see distributeSQL). Nothing
// to do on a current layout.
func relayout(ctx context.Context, conn *pgx.Conn, schema string) error {
	for _, t := range append(slices.Clone(CitusDistributed), CitusReference...) {
		var size int64
		if err := conn.QueryRow(ctx, "SELECT pg_relation_size($1::regclass)", pgx.Identifier{schema, t}.Sanitize()).Scan(&size); err != nil {
			return fmt.Errorf("sqlschema: distribute: %w", err)
		}
		if size == 0 {
			continue
		}
		q := render(fmt.Sprintf("SELECT truncate_local_data_after_distributing_table('{{schema}}.%s')", t), schema)
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("sqlschema: distribute: %s: %w", q, err)
		}
	}
	for _, t := range CitusCoordinator {
		var ref bool
		if err := conn.QueryRow(ctx, render(fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
			WHERE logicalrelid = to_regclass('{{schema}}.%s'))`, t), schema)).Scan(&ref); err != nil {
			return fmt.Errorf("sqlschema: distribute: %w", err)
		}
		if !ref {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for _, q := range []string{
				fmt.Sprintf("ALTER TABLE {{schema}}.%s DROP CONSTRAINT IF EXISTS %s_queue_id_fkey", t, t),
				fmt.Sprintf("SELECT undistribute_table('{{schema}}.%s')", t),
			} {
				if _, err := tx.Exec(ctx, render(q, schema)); err != nil {
					return fmt.Errorf("%s: %w", render(q, schema), err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("sqlschema: distribute: %w", err)
		}
	}
	return nil
}
