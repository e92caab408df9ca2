package fusion

import "github.com/gofrs/uuid/v5"

// Keyer is what an Engine keys its work by. Hash must be deterministic: a
// key always lands on the same shard, which is what makes one goroutine the
// sole owner of its state. Equal keys must hash alike.
type Keyer interface {
	comparable
	Hash() uint64
}

// Key identifies one accumulation group: a partition of a queue of a tenant.
// The tenant is part of the key so two tenants pushing to a queue of the
// same name accumulate separate segments.
type Key struct {
	Tenant    uuid.UUID
	Queue     string
	Partition string
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
	keySep    = 0x1f
)

// Hash is FNV-1a over tenant \x1f queue \x1f partition, computed in place so
// routing a submission allocates nothing.
func (k Key) Hash() uint64 {
	h := uint64(fnvOffset)
	for _, b := range k.Tenant {
		h = (h ^ uint64(b)) * fnvPrime
	}
	h = (h ^ keySep) * fnvPrime
	for i := 0; i < len(k.Queue); i++ {
		h = (h ^ uint64(k.Queue[i])) * fnvPrime
	}
	h = (h ^ keySep) * fnvPrime
	for i := 0; i < len(k.Partition); i++ {
		h = (h ^ uint64(k.Partition[i])) * fnvPrime
	}
	return h
}
