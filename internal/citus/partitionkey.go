package citus

import (
	"crypto/sha256"
	"encoding/binary"
)

// PartitionKey is the id the function layer's partition_key gives
// partition name of the queue with id queueID at probe 0 or 1 (probe 1
// only when another partition held the first: a 63-bit collision): the
// first 63 bits of sha256(queue id, probe, name), the two numbers as
// big-endian 8 and 4 bytes, 0 taken as 1. With it a client knows a
// partition's shard from its queue and name (see Shards.Of).
func PartitionKey(queueID int64, name string, probe int32) int64 {
	h := sha256.New()
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], uint64(queueID))
	binary.BigEndian.PutUint32(b[8:], uint32(probe))
	h.Write(b[:])
	h.Write([]byte(name))
	var sum [sha256.Size]byte
	id := int64(binary.BigEndian.Uint64(h.Sum(sum[:0])) &^ (1 << 63))
	return max(id, 1)
}
