package queen

import "time"

// PopRescan sets how often c's waiting pops look again without a wake: an
// option for Open in tests.
func PopRescan(d time.Duration) func(*Config) {
	return func(c *Config) { c.testKnobs().popRescan = d }
}

// NoLinger keeps c's Consume calls from keeping drained leases: an option
// for Open in tests of the claim and settle paths.
func NoLinger(c *Config) { c.testKnobs().noLinger = true }

// ForgetSegments empties c's cache of decompressed segments.
func (c *Client) ForgetSegments() {
	s := &c.e.segs
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.m)
	s.bytes = 0
}
