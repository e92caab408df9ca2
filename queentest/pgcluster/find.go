package pgcluster

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrNoBinaries reports that no directory holding pg_ctl, initdb and
// postgres could be found.
var ErrNoBinaries = errors.New("pgcluster: PostgreSQL server binaries (pg_ctl, initdb, postgres) not found on PATH or in /usr/lib/postgresql/*/bin")

// binaries are the programs a directory must hold to be usable.
var binaries = []string{"pg_ctl", "initdb", "postgres"}

// FindBinaries returns a directory holding pg_ctl, initdb and postgres. It
// searches PATH first, then the newest /usr/lib/postgresql/<version>/bin
// (the Debian/Ubuntu layout, which does not put the server on PATH).
func FindBinaries() (string, error) {
	return findBinaries(filepath.SplitList(os.Getenv("PATH")), "/usr/lib/postgresql")
}

func findBinaries(path []string, libRoot string) (string, error) {
	for _, dir := range path {
		// An empty PATH element means the current directory; a test
		// helper should not pick up binaries from wherever it runs.
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		if hasBinaries(dir) {
			return realDir(dir), nil
		}
	}
	matches, _ := filepath.Glob(filepath.Join(libRoot, "*", "bin"))
	slices.SortFunc(matches, func(a, b string) int {
		// Newest first.
		return slices.Compare(versionOf(b), versionOf(a))
	})
	for _, dir := range matches {
		if hasBinaries(dir) {
			return dir, nil
		}
	}
	return "", ErrNoBinaries
}

// realDir follows a symlinked pg_ctl (e.g. /usr/local/bin/pg_ctl ->
// /usr/lib/postgresql/15/bin/pg_ctl) to the real installation directory
// when that directory is complete, so callers see where the server lives.
func realDir(dir string) string {
	target, err := filepath.EvalSymlinks(filepath.Join(dir, "pg_ctl"))
	if err != nil {
		return dir
	}
	if real := filepath.Dir(target); hasBinaries(real) {
		return real
	}
	return dir
}

func hasBinaries(dir string) bool {
	for _, name := range binaries {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// versionOf parses ".../<version>/bin" into numeric components; a
// non-numeric version yields nil and sorts as the oldest.
func versionOf(binDir string) []int {
	parts := strings.Split(filepath.Base(filepath.Dir(binDir)), ".")
	v := make([]int, 0, len(parts))
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}
