//go:build unix

package pgcluster

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// owner is the OS account the server runs as; zero means the current user.
type owner struct {
	set      bool
	uid, gid int
}

// serverOwner picks the account for initdb, pg_ctl and postgres: the
// server refuses to run as root, so root hands it to the "postgres" user.
func serverOwner() (owner, error) {
	if os.Geteuid() != 0 {
		return owner{}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return owner{}, fmt.Errorf("%w: %v", ErrNoUser, err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return owner{}, fmt.Errorf("%w: uid %q: %v", ErrNoUser, u.Uid, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return owner{}, fmt.Errorf("%w: gid %q: %v", ErrNoUser, u.Gid, err)
	}
	return owner{set: true, uid: uid, gid: gid}, nil
}

func (o owner) chown(path string) error {
	if !o.set {
		return nil
	}
	return os.Chown(path, o.uid, o.gid)
}

// sysProcAttr puts every child in its own process group, so a Ctrl-C
// aimed at the terminal's foreground group (the test binary) does not
// take the server down mid-test, and switches to the owner if needed.
func (o owner) sysProcAttr(server bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	if o.set {
		a.Credential = &syscall.Credential{Uid: uint32(o.uid), Gid: uint32(o.gid)}
	}
	if server {
		setParentDeathSignal(a)
	}
	return a
}

func signalProcess(pid int, sig syscall.Signal) error {
	return syscall.Kill(pid, sig)
}

const (
	sigImmediate = syscall.SIGQUIT // postmaster: immediate shutdown
	sigFast      = syscall.SIGINT  // postmaster: fast shutdown
	sigKill      = syscall.SIGKILL
)
