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

// NoHandOff keeps c's pushes from taking for its lingering Consume
// workers (push_take): they take by pop_linger.
func NoHandOff(c *Config) { c.testKnobs().noHandOff = true }

// TakeHook runs f in each push that reserved a lingering worker, before
// its statement: an option for Open in tests.
func TakeHook(f func()) func(*Config) { return func(c *Config) { c.testKnobs().takeHook = f } }

// ForgetSegments empties c's cache of decompressed segments.
func (c *Client) ForgetSegments() {
	s := &c.e.segs
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.m)
	s.bytes = 0
}

// LingerSlots is how many of c's Consume workers linger offering their
// partition to c's pushes (see lingerSlots).
func LingerSlots(c *Client) int { return int(c.e.lingers.n.Load()) }
