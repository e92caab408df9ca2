package queen

import (
	"bytes"
	"sync"

	"github.com/e03140bc/queen/internal/segment"
)

// segCacheBytes bounds the segments (stored and decompressed) a client keeps.
const segCacheBytes = 64 << 20

// segCache keeps decompressed segments that a pop read only part of, so the
// pops that read the rest do not decompress them again: a segment written by
// a 1000-item push and popped one message at a time would otherwise be
// decompressed 1000 times. An entry is dropped when a pop reads through its
// last message, or arbitrarily when the cache is over its budget.
//
// Entries are found by partition id and base offset but used only for the
// very blob they were decompressed from: the same key can name another
// segment after a restore, a failover to a replica that lost commits, or a
// schema dropped and re-created, and every pop reads the stored blob
// anyway, so comparing it costs a memcmp, far less than a decompression.
type segCache struct {
	mu    sync.Mutex
	m     map[cachedSeg]segEntry
	bytes int
}

type cachedSeg struct{ pid, base int64 }

type segEntry struct {
	blob []byte // as stored: what the entry is valid for
	raw  []byte // the packed frames
}

func (v segEntry) size() int { return len(v.blob) + len(v.raw) }

// frames returns the packed frames of segment (pid, base), whose stored blob
// is blob, for a pop that reads it through offset last of end. A segment
// read through its end and not cached is decompressed into scratch, and
// owned reports it: only then may the caller reuse the result as scratch.
// Anything else may be shared with other pops and is read-only. The cache
// keeps blob: the caller must not modify it afterwards.
func (c *segCache) frames(pid, base, end, last int64, blob, scratch []byte) (frames []byte, owned bool, err error) {
	k := cachedSeg{pid, base}
	done := last >= end
	c.mu.Lock()
	v, ok := c.m[k]
	stale := ok && !bytes.Equal(v.blob, blob)
	if stale || (ok && done) {
		delete(c.m, k)
		c.bytes -= v.size()
	}
	c.mu.Unlock()
	if ok && !stale {
		return v.raw, false, nil
	}
	if done {
		raw, err := segment.Decompress(scratch[:0], blob)
		return raw, err == nil, err
	}
	raw, err := segment.Decompress(nil, blob)
	v = segEntry{blob: blob, raw: raw}
	if err != nil || v.size() > segCacheBytes/4 {
		return raw, false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[cachedSeg]segEntry)
	}
	if old, ok := c.m[k]; ok {
		delete(c.m, k)
		c.bytes -= old.size()
	}
	for kk, vv := range c.m {
		if c.bytes+v.size() <= segCacheBytes {
			break
		}
		delete(c.m, kk)
		c.bytes -= vv.size()
	}
	c.m[k] = v
	c.bytes += v.size()
	return raw, false, nil
}

// cached returns the packed frames of segment (pid, base) the cache holds,
// for a pop that reads it through offset last of end and was not sent its
// blob (pop_ahead leaves out a segment the lease's holder was sent before:
// the lease vouches that it is the one cached). ok is false when the cache
// does not hold it. Like a shared result of frames, read-only.
func (c *segCache) cached(pid, base, end, last int64) (frames []byte, ok bool) {
	k := cachedSeg{pid, base}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	if ok && last >= end {
		delete(c.m, k)
		c.bytes -= v.size()
	}
	return v.raw, ok
}
