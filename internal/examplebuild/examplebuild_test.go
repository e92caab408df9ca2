package examplebuild_test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const module = "github.com/e03140bc/queen"

// Every program under examples/ builds outside this module: copied as is
// into a fresh module that requires queen (replaced by this checkout), so
// it may not import queen's internal packages or rely on its directory.
// examples/bench is a module of its own: it is copied with its go.mod and
// go.sum, its replace pointed at this checkout.
func TestExamplesBuildOutsideModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every example: skipped with -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	// Reuse this machine's module cache, so the build works offline.
	modCache := goEnv(t, goBin, "GOMODCACHE")
	entries, err := os.ReadDir(filepath.Join(repo, "examples"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		n++
		name := e.Name()
		t.Run(name, func(t *testing.T) {
			src := filepath.Join(repo, "examples", name)
			dst := t.TempDir()
			copyDir(t, src, dst)
			ownModule := fileExists(filepath.Join(dst, "go.mod"))
			if ownModule {
				run(t, dst, modCache, goBin, "mod", "edit", "-replace", module+"="+repo)
			} else {
				gomod := "module example.com/" + name + "\n\ngo 1.26.0\n\nrequire " + module +
					" v0.0.0-00010101000000-000000000000\n\nreplace " + module + " => " + repo + "\n"
				if err := os.WriteFile(filepath.Join(dst, "go.mod"), []byte(gomod), 0o644); err != nil {
					t.Fatal(err)
				}
				sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dst, "go.sum"), sum, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			run(t, dst, modCache, goBin, "build", "-o", os.DevNull, ".")
			if ownModule {
				run(t, dst, modCache, goBin, "vet", ".")
			}
		})
	}
	if n == 0 {
		t.Fatal("no examples found")
	}
}

func goEnv(t *testing.T, goBin, name string) string {
	t.Helper()
	out, err := exec.Command(goBin, "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

func run(t *testing.T, dir, modCache, goBin string, args ...string) {
	t.Helper()
	// Bounded by the test binary's deadline, not a fixed time: on a loaded
	// machine a first build of the bench's dependencies takes minutes.
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
	}
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	// -mod=mod lets go fill in the fresh module's requirements; GOWORK=off
	// keeps any workspace of the caller out of it.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOMODCACHE="+modCache)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s in a copy of the example: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// copyDir copies src's Go sources and module files, not its data (e.g.
// examples/bench/results).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != src {
				return filepath.SkipDir // one package per example
			}
			return nil
		}
		name := d.Name()
		if !strings.HasSuffix(name, ".go") && name != "go.mod" && name != "go.sum" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, name), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
