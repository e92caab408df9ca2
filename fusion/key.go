package fusion

// Keyer is what an Engine keys its work by. Hash must be deterministic: a
// key always lands on the same shard, which is what makes one goroutine the
// sole owner of its state. Equal keys must hash alike.
type Keyer interface {
	comparable
	Hash() uint64
}
