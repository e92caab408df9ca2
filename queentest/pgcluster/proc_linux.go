package pgcluster

import "syscall"

// setParentDeathSignal asks the kernel to send the postmaster SIGQUIT
// (immediate shutdown) if the process that started it dies without
// calling Close, so a crashed or killed test binary leaves no server
// behind (its files under /tmp do stay). The signal is tied to the OS
// thread that forked, which the Go runtime keeps alive for the life of
// the process unless a goroutine exits while locked to it.
func setParentDeathSignal(a *syscall.SysProcAttr) {
	a.Pdeathsig = syscall.SIGQUIT
}
