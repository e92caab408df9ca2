package queen

import (
	"sync"

	"github.com/e03140bc/queen/internal/segment"
)

// segCacheBytes bounds the decompressed segments a client keeps.
const segCacheBytes = 64 << 20

// segCache keeps decompressed segments that a pop read only part of, so the
// pops that read the rest do not decompress them again: a segment written by
// a 1000-item push and popped one message at a time would otherwise be
// decompressed 1000 times. A segment is immutable once written (its key,
// partition id and base offset, is never reused), so entries need no
// invalidation; one is dropped when a pop reads through its last message, or
// arbitrarily when the cache is over its budget.
type segCache struct {
	mu    sync.Mutex
	m     map[cachedSeg][]byte
	bytes int
}

type cachedSeg struct{ pid, base int64 }

// frames returns the packed frames of segment (pid, base), whose stored blob
// is blob, for a pop that reads it through offset last of end. A segment
// read through its end and not cached is decompressed into scratch, and
// owned reports it: only then may the caller reuse the result as scratch.
// Anything else may be shared with other pops and is read-only.
func (c *segCache) frames(pid, base, end, last int64, blob, scratch []byte) (frames []byte, owned bool, err error) {
	k := cachedSeg{pid, base}
	done := last >= end
	c.mu.Lock()
	raw, ok := c.m[k]
	if ok && done {
		delete(c.m, k)
		c.bytes -= len(raw)
	}
	c.mu.Unlock()
	if ok {
		return raw, false, nil
	}
	if done {
		raw, err := segment.Decompress(scratch[:0], blob)
		return raw, err == nil, err
	}
	raw, err = segment.Decompress(nil, blob)
	if err != nil || len(raw) > segCacheBytes/4 {
		return raw, false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[cachedSeg][]byte)
	}
	if old, ok := c.m[k]; ok {
		c.bytes -= len(old)
	}
	for kk, v := range c.m {
		if c.bytes+len(raw) <= segCacheBytes {
			break
		}
		delete(c.m, kk)
		c.bytes -= len(v)
	}
	c.m[k] = raw
	c.bytes += len(raw)
	return raw, false, nil
}
