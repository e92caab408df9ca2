// Package citus maps partition ids to the Citus worker groups that hold
// them, so a client can group a bundle's partitions by worker and commit
// each group in one single-node transaction (no two-phase commit). It
// computes Citus's hash of a bigint distribution value (PostgreSQL's
// hashint8) on the client, and reads the shard ranges and placements of a
// distributed table from the coordinator's metadata.
//
// Internal: a building block of the Citus deployment (DESIGN.md, "On
// Citus"), with no stability promise.
package citus

import (
	"context"
	"fmt"
	"math/bits"
	"sort"

	"github.com/jackc/pgx/v5"
)

// HashInt8 is PostgreSQL's hashint8 (the bigint hash Citus routes by): it
// folds the high half into the low one and runs Bob Jenkins' lookup3 final
// mix, as hash_uint32 does.
func HashInt8(v int64) int32 {
	lo, hi := uint32(v), uint32(v>>32)
	if v >= 0 {
		lo ^= hi
	} else {
		lo ^= ^hi
	}
	return int32(hashUint32(lo))
}

func hashUint32(k uint32) uint32 {
	a := uint32(0x9e3779b9) + 4 + 3923095
	b, c := a, a
	a += k
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

// Shard is one shard of a hash-distributed table: the hash range it holds
// and the worker group (pg_dist_node.groupid) of its placement.
type Shard struct {
	ID       int64
	Min, Max int32
	Group    int32
}

// Shards is a table's shards in hash order.
type Shards []Shard

// Querier is what Load reads with: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Load reads the shards of the hash-distributed table (a regclass text,
// such as `"queen".partitions`) from the coordinator's metadata. A shard
// placed on several groups (replication) reports the lowest; a rebalance
// moves shards, so a caller reloads when a routed call lands elsewhere.
func Load(ctx context.Context, q Querier, table string) (Shards, error) {
	rows, err := q.Query(ctx, `SELECT s.shardid, s.shardminvalue::integer, s.shardmaxvalue::integer, min(pl.groupid)
		FROM pg_dist_shard s JOIN pg_dist_placement pl ON pl.shardid = s.shardid
		WHERE s.logicalrelid = $1::regclass
		GROUP BY 1, 2, 3 ORDER BY 2`, table)
	if err != nil {
		return nil, fmt.Errorf("citus: shards of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Shard, error) {
		var s Shard
		err := r.Scan(&s.ID, &s.Min, &s.Max, &s.Group)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("citus: shards of %s: %w", table, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("citus: %s is not hash-distributed", table)
	}
	return out, nil
}

// Of returns the shard holding distribution value v; ok is false if no
// shard's range covers its hash (metadata read mid-split).
func (s Shards) Of(v int64) (sh Shard, ok bool) {
	h := HashInt8(v)
	i := sort.Search(len(s), func(i int) bool { return s[i].Max >= h })
	if i == len(s) || s[i].Min > h {
		return Shard{}, false
	}
	return s[i], true
}
