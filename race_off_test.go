//go:build !race

package queen_test

// raceEnabled is true when the race detector is on.
const raceEnabled = false
