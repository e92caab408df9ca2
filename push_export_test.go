package queen

import "time"

// ExpireQueueMeta makes every cached queue setting of c's engine look older
// than its time to live, and forgets that a read failed recently, as if the
// cache had not been used for a while.
func ExpireQueueMeta(c *Client) {
	e := c.e
	e.meta.mu.Lock()
	defer e.meta.mu.Unlock()
	for k, m := range e.meta.m {
		m.fetched = time.Time{}
		e.meta.m[k] = m
	}
	e.meta.downUntil = time.Time{}
}
