package citus

import (
	"crypto/sha256"
	"encoding/binary"
)

// PartitionKey is the id the function layer's partition_key gives
// partition name of the queue with id queueID at probe 0 or 1 (probe 1
// only when another partition held the first: a collision): the first 8
// bytes of sha256(queue id, probe, name), the two numbers big-endian, 8
// and 4 bytes, read as a big-endian int64 with its sign bit cleared and its
// lowest bit set (positive). With it a client knows a partition's shard
// from its queue and name (see Shards.Of).
func PartitionKey(queueID int64, name string, probe int32) int64 {
	h := sha256.New()
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], uint64(queueID))
	binary.BigEndian.PutUint32(b[8:], uint32(probe))
	h.Write(b[:])
	h.Write([]byte(name))
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0]))&^(1<<63) | 1)
}
