package queen

import "time"

// PopRescan sets how often c's waiting pops look again without a wake: an
// option for Open in tests.
func PopRescan(d time.Duration) func(*Config) {
	return func(c *Config) { c.testKnobs().popRescan = d }
}

// ForgetSegments empties c's cache of decompressed segments.
func (c *Client) ForgetSegments() {
	s := &c.e.segs
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.m)
	s.bytes = 0
}
