package queen

import "time"

// SchedulePoll sets the scheduled mover's backstop poll: an option for Open
// in tests.
func SchedulePoll(d time.Duration) func(*Config) {
	return func(c *Config) { c.testKnobs().schedulePoll = d }
}
