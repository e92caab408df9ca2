//go:build !windows

package spool

import (
	"errors"
	"os"
)

// syncDir makes the directory's entries (a created, renamed or removed file)
// durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
