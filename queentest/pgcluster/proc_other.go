//go:build !unix

package pgcluster

import (
	"errors"
	"syscall"
)

// errUnsupported: process groups, credentials and signals used here are
// Unix concepts; elsewhere Start fails with this error.
var errUnsupported = errors.New("pgcluster: only supported on Unix")

type owner struct{}

func serverOwner() (owner, error) { return owner{}, errUnsupported }

func (owner) chown(string) error { return errUnsupported }

func (owner) sysProcAttr(bool) *syscall.SysProcAttr { return nil }

func signalProcess(int, syscall.Signal) error { return errUnsupported }

const (
	sigImmediate = syscall.Signal(3)
	sigFast      = syscall.Signal(2)
	sigKill      = syscall.Signal(9)
)
