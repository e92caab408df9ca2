//go:build race

package dedup

// The race detector makes sync.Pool drop items at random.
const raceEnabled = true
