//go:build unix && !linux

package pgcluster

import "syscall"

// setParentDeathSignal is a no-op where the kernel has no parent-death
// signal: there, a server whose parent crashed keeps running until it is
// stopped by hand (pg_ctl stop -D <DataDir>).
func setParentDeathSignal(*syscall.SysProcAttr) {}
