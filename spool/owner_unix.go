//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package spool

import (
	"fmt"
	"os"
	"syscall"
)

// checkDir fails with ErrUnsafeDir unless dir, and the symlink dir may be,
// belong to this process's effective user and dir is not writable by group
// or others.
func checkDir(dir string) error {
	lfi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if lfi.Mode()&os.ModeSymlink != 0 {
		if err := checkOwner(dir, lfi); err != nil {
			return err
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("spool: %s is not a directory", dir)
	}
	if err := checkOwner(dir, fi); err != nil {
		return err
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("%w: %s has mode %#o, writable by group or others (want 0700)", ErrUnsafeDir, dir, perm)
	}
	return nil
}

// checkOwner fails with ErrUnsafeDir unless fi (of path) belongs to this
// process's effective user.
func checkOwner(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Geteuid(); int(st.Uid) != uid {
		return fmt.Errorf("%w: %s is owned by uid %d, not this process's uid %d", ErrUnsafeDir, path, st.Uid, uid)
	}
	return nil
}
