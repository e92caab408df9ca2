package queen

import "time"

// MemberTiming sets c's member heartbeat (DefaultMemberHeartbeat) and TTL
// (MemberTTL): an option for Open in tests.
func MemberTiming(heartbeat, ttl time.Duration) func(*Config) {
	return func(c *Config) { c.testKnobs().memberHeartbeat, c.testKnobs().memberTTL = heartbeat, ttl }
}
