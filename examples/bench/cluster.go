//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cluster is a throwaway PostgreSQL started from the locally installed
// server binaries: its own directory under /tmp, 127.0.0.1 on a free port,
// trust authentication for the superuser "postgres". As root, initdb and
// postgres run as the "postgres" OS user (the server refuses root).
type cluster struct {
	URL     string
	Version string
	root    string
	data    string
	bin     string
	cred    *syscall.Credential
	cmd     *exec.Cmd
	exited  chan struct{}
}

func findBinDir() (string, error) {
	has := func(dir string) bool {
		for _, n := range []string{"initdb", "pg_ctl", "postgres"} {
			fi, err := os.Stat(filepath.Join(dir, n))
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if filepath.IsAbs(dir) && has(dir) {
			// Prefer the real installation directory behind symlinks.
			if t, err := filepath.EvalSymlinks(filepath.Join(dir, "postgres")); err == nil && has(filepath.Dir(t)) {
				return filepath.Dir(t), nil
			}
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first.
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, dir := range dirs {
		if has(dir) {
			return dir, nil
		}
	}
	return "", errors.New("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin; pass -url")
}

// startCluster runs initdb and starts postgres with fsync on and the given
// extra settings, and waits until it accepts connections.
func startCluster(ctx context.Context, settings map[string]string) (*cluster, error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	c := &cluster{bin: bin, exited: make(chan struct{})}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, but no \"postgres\" OS user to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if c.root, err = os.MkdirTemp("/tmp", "qbench"); err != nil {
		return nil, err
	}
	c.data = filepath.Join(c.root, "data")
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	if err := c.chown(c.root); err != nil {
		return nil, err
	}
	if out, err := c.run(ctx, "initdb", "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if out, err := c.run(ctx, "postgres", "--version"); err == nil {
		c.Version = strings.TrimSpace(string(out))
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	conf := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(port),
		"unix_socket_directories": c.root,
		"max_connections":         "300",
		"fsync":                   "on",
		"full_page_writes":        "on",
		"synchronous_commit":      "on",
		"logging_collector":       "off",
		"lc_messages":             "C",
	}
	maps.Copy(conf, settings)
	var b strings.Builder
	b.WriteString("\n# examples/bench\n")
	for _, k := range slices.Sorted(maps.Keys(conf)) {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(conf[k], "'", "''"))
	}
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(c.root, "server.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// postgres itself, not pg_ctl, so it is our child: we can reap it, and
	// the kernel stops it (SIGQUIT) should this process die first.
	c.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", c.data)
	c.cmd.Dir = c.root
	c.cmd.Env = childEnv()
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	setParentDeathSignal(c.cmd.SysProcAttr)
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(filepath.Join(c.data, "postmaster.pid"))
		if lines := strings.Split(string(b), "\n"); err == nil && len(lines) >= 8 && strings.TrimSpace(lines[7]) == "ready" {
			break
		}
		select {
		case <-c.exited:
			log, _ := os.ReadFile(filepath.Join(c.root, "server.log"))
			return nil, fmt.Errorf("postgres exited during start-up:\n%s", log)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, errors.New("postgres not ready after 1 minute")
		}
	}
	ok = true
	return c, nil
}

// Pid is the postmaster's process id.
func (c *cluster) Pid() int { return c.cmd.Process.Pid }

// Close stops the server (immediate shutdown) and removes its files.
func (c *cluster) Close() {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = syscall.Kill(c.cmd.Process.Pid, syscall.SIGQUIT)
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.exited
		}
	}
	if c.root != "" {
		_ = os.RemoveAll(c.root)
	}
}

func (c *cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	return os.Chown(path, int(c.cred.Uid), int(c.cred.Gid))
}

// run runs a short-lived server tool as the cluster's owner.
func (c *cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.root // the owner may not be able to enter our working directory
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// childEnv drops PG* variables so the caller's client settings cannot
// redirect the tools or the server.
func childEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PG") })
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
