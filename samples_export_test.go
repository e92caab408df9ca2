package queen

import "time"

// SampleEvery sets the client's SampleInterval (what its maintenance takes
// and its Queue.Samples reads), so a test sees the ring turn in seconds.
func SampleEvery(d time.Duration) func(*Config) {
	return func(c *Config) { c.testKnobs().sampleInterval = d }
}
