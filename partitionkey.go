package queen

import "github.com/gofrs/uuid/v5"

// partitionKey is what the push fusion accumulates by: a partition of a
// queue of a tenant. The tenant is part of it so two tenants pushing to a
// queue of the same name accumulate separate segments.
type partitionKey struct {
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
func (k partitionKey) Hash() uint64 {
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
