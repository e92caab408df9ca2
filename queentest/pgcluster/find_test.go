package pgcluster

import (
	"os"
	"path/filepath"
	"testing"
)

// fakeInstall creates dir with the given executables.
func fakeInstall(t *testing.T, dir string, names ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFindBinariesNewestVersion(t *testing.T) {
	lib := t.TempDir()
	fakeInstall(t, filepath.Join(lib, "9.6", "bin"), binaries...)
	fakeInstall(t, filepath.Join(lib, "15", "bin"), binaries...)
	fakeInstall(t, filepath.Join(lib, "10", "bin"), binaries...)
	fakeInstall(t, filepath.Join(lib, "16", "bin"), "pg_ctl", "postgres") // incomplete
	fakeInstall(t, filepath.Join(lib, "devel", "bin"), binaries...)
	got, err := findBinaries(nil, lib)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(lib, "15", "bin"); got != want {
		t.Fatalf("findBinaries = %q, want %q (numeric sort, newest complete)", got, want)
	}
}

func TestFindBinariesPathFirst(t *testing.T) {
	lib := t.TempDir()
	fakeInstall(t, filepath.Join(lib, "15", "bin"), binaries...)
	onPath := t.TempDir()
	fakeInstall(t, onPath, binaries...)
	partial := t.TempDir()
	fakeInstall(t, partial, "pg_ctl")
	got, err := findBinaries([]string{"", "relative", partial, onPath}, lib)
	if err != nil {
		t.Fatal(err)
	}
	if got != onPath {
		t.Fatalf("findBinaries = %q, want PATH entry %q", got, onPath)
	}
}

func TestFindBinariesFollowsSymlinks(t *testing.T) {
	real := filepath.Join(t.TempDir(), "15", "bin")
	fakeInstall(t, real, binaries...)
	links := t.TempDir()
	for _, n := range binaries {
		if err := os.Symlink(filepath.Join(real, n), filepath.Join(links, n)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := findBinaries([]string{links}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := filepath.EvalSymlinks(real); got != want {
		t.Fatalf("findBinaries = %q, want resolved %q", got, want)
	}
}

func TestFindBinariesNone(t *testing.T) {
	if _, err := findBinaries([]string{t.TempDir()}, t.TempDir()); err != ErrNoBinaries {
		t.Fatalf("err = %v, want ErrNoBinaries", err)
	}
}
