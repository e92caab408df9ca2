package queen

import "time"

// SetPopRescan sets the waiting pop's rescan interval and returns a func
// restoring it. Tests that use it must not run in parallel with others.
func SetPopRescan(d time.Duration) (restore func()) {
	old := popRescan
	popRescan = d
	return func() { popRescan = old }
}
