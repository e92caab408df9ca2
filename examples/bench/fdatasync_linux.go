package main

import (
	"os"
	"syscall"
)

// fdatasync is what PostgreSQL's default wal_sync_method uses on Linux.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
