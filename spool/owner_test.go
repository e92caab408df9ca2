package spool

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestOpenRefusesUnsafeDir: a spool directory someone else could write to,
// or that someone else owns (directly or behind a symlink), is refused at
// Open with ErrUnsafeDir; a new one is created private.
func TestOpenRefusesUnsafeDir(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix ownership")
	}
	base := t.TempDir()
	fresh := filepath.Join(base, "fresh")
	s := openT(t, fresh)
	s.Close()
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("new spool directory: %v, %v; want mode 0700", fi.Mode(), err)
	}

	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(open, link); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{"world-writable": open, "symlink to a world-writable directory": link}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(base, "foreign")
		if err := os.Mkdir(foreign, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(foreign, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		cases["owned by another user"] = foreign
		flink := filepath.Join(base, "foreign-link")
		if err := os.Symlink(fresh, flink); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(flink, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		cases["symlink owned by another user"] = flink
		mixed := filepath.Join(base, "mixed")
		if err := os.Mkdir(mixed, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mixed, "0000000000000001.spool"), fileHeader[:], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(mixed, "0000000000000001.spool"), 4242, 4242); err != nil {
			t.Fatal(err)
		}
		cases["holding another user's data file"] = mixed
	} else {
		t.Log("not root: the foreign-owner cases need chown")
	}
	for name, dir := range cases {
		s, err := Open(Options{Dir: dir, Logger: quietLogger()})
		if err == nil {
			s.Close()
			t.Errorf("%s: Open succeeded", name)
			continue
		}
		if !errors.Is(err, ErrUnsafeDir) {
			t.Errorf("%s: %v, want ErrUnsafeDir", name, err)
		}
	}
}
