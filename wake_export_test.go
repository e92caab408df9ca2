package queen

// NotifyChannel is the LISTEN/NOTIFY channel c's processes wake each other on.
func NotifyChannel(c *Client) string { return c.e.sql.Channel }

// ParkedPops counts the waiting pops of c's engine, parked or looking.
func ParkedPops(c *Client) int { return c.e.wake.Parked() }
