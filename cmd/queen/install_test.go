package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// README's install commands, run as written against a fresh clone of this
// repository (its URL replaced by the local checkout), install a queen
// command that runs. GOPROXY=off: the modules come from the cache the test
// build filled, and nothing is fetched.
func TestReadmeInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var clone, install string
	for _, block := range strings.Split(string(readme), "```sh\n")[1:] {
		body, _, _ := strings.Cut(block, "```")
		if strings.Contains(body, "go install") && strings.Contains(body, "git clone") {
			lines := strings.Split(strings.TrimSpace(body), "\n")
			if len(lines) != 2 {
				t.Fatalf("README's install block has %d lines, want git clone and the install:\n%s", len(lines), body)
			}
			clone, install = lines[0], lines[1]
		}
	}
	if clone == "" {
		t.Fatal("README has no ```sh block with git clone and go install")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	url := strings.Fields(clone)[2]
	if !strings.HasPrefix(clone, "git clone ") || !strings.HasSuffix(url, "/queen.git") {
		t.Fatalf("README's clone line %q: want git clone <url>/queen.git", clone)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	script := strings.Replace(clone, url, root, 1) + " queen\n" + install + "\n"
	cmd := exec.CommandContext(ctxT(t), "sh", "-e", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOPROXY=off", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	var out bytes.Buffer
	q := exec.CommandContext(ctxT(t), filepath.Join(bin, "queen"), "help")
	q.Stdout, q.Stderr = &out, &out
	_ = q.Run() // help may exit non-zero; its text is what counts
	if !strings.Contains(out.String(), "migrate-up") {
		t.Fatalf("installed queen help:\n%s", out.String())
	}
}
