//go:build unix

package fusion

import "syscall"

// cpuTime is the process's user and system CPU time in nanoseconds, for
// benchmarks whose wall time a busy machine blurs; ok is false where the
// platform does not tell.
func cpuTime() (ns int64, ok bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
