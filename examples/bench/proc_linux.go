package main

import "syscall"

// setParentDeathSignal makes the kernel send the postmaster SIGQUIT
// (immediate shutdown) if this process dies without stopping it.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGQUIT }
