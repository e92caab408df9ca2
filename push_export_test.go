package queen

import "time"

// ExpireQueueMeta makes every cached queue setting of c's engine look older
// than its time to live, as if the cache had not been refreshed for a while.
func ExpireQueueMeta(c *Client) {
	e := c.e
	e.meta.mu.Lock()
	defer e.meta.mu.Unlock()
	for k, m := range e.meta.m {
		m.fetched = time.Time{}
		e.meta.m[k] = m
	}
}
