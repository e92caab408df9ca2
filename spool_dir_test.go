package queen_test

import (
	"context"
	"os"
	"testing"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// TestDefaultSpoolDirIsPrivate: the default spool directory (under the
// shared temporary directory) is created 0700, and one that others can
// write to is refused at Open.
func TestDefaultSpoolDirIsPrivate(t *testing.T) {
	cfg := queen.Config{DatabaseURL: pgtest.URL(t), Schema: pgtest.Schema(t), Logger: pgtest.Logger(t), Maintenance: queen.MaintenanceConfig{Interval: -1}}
	c, err := queen.Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := c.SpoolStats().Dir
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("default spool directory %s has mode %v, want 0700", dir, fi.Mode().Perm())
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if c, err := queen.Open(ctxT(t), cfg); err == nil {
		c.Close(context.Background())
		t.Fatalf("Open accepted a world-writable spool directory %s", dir)
	} else {
		t.Logf("Open: %v", err)
	}
}
