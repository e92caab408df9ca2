package fusion

import (
	"hash/maphash"

	"github.com/gofrs/uuid/v5"
)

// Key is the tests' key: a partition of a queue of a tenant, as queen keys
// its pushes.
type Key struct {
	Tenant    uuid.UUID
	Queue     string
	Partition string
}

var keySeed = maphash.MakeSeed()

func (k Key) Hash() uint64 { return maphash.Comparable(keySeed, k) }
