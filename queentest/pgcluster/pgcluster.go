// Package pgcluster creates, starts, stops and removes throwaway
// PostgreSQL clusters for tests, benchmarks and examples.
//
// Each cluster lives in a fresh directory under /tmp (data directory, unix
// socket and server log) and listens on 127.0.0.1 on a free TCP port with
// trust authentication for the superuser "postgres". When the calling
// process runs as root, initdb, pg_ctl and postgres run as the "postgres"
// OS user, because the server refuses to run as root.
//
// Callers must call Close when done: it stops the server and deletes the
// cluster's files. On Linux the server is also shut down if the calling
// process dies first, but its files are then left behind in /tmp.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNoUser reports that the process runs as root and there is no
// "postgres" OS user to run the server as.
var ErrNoUser = errors.New("pgcluster: running as root, but no usable \"postgres\" OS user to run the server as")

// ErrClosed is returned by Start on a closed cluster.
var ErrClosed = errors.New("pgcluster: cluster is closed")

// errExited marks a Stop that found the server already dead.
var errExited = errors.New("pgcluster: postgres had exited unexpectedly")

// Options configures a new cluster. The zero value suits fast tests.
type Options struct {
	// Fsync turns on fsync and full_page_writes, for fault-injection and
	// benchmark code that needs crash-safe, realistic I/O. Off by default:
	// tests then lose nothing when only the server process crashes, which
	// is all they simulate. synchronous_commit stays on either way, so a
	// committed transaction survives Stop("immediate").
	Fsync bool

	// Settings are extra postgresql.conf settings, applied after (so
	// overriding) the package defaults, e.g. {"synchronous_commit": "off"}.
	Settings map[string]string

	// Log, if set, receives the output of initdb and pg_ctl and a line per
	// lifecycle step. The server's own log is in ServerLog.
	Log io.Writer

	// BinDir holds pg_ctl, initdb and postgres; empty means FindBinaries.
	BinDir string
}

// Production returns Options for a production-like server, for benchmarks
// whose figures should carry over to a real deployment: fsync,
// full_page_writes and synchronous_commit on, and memory and WAL settings
// of a modest dedicated server rather than the small defaults tests use.
// Callers may add to or override its Settings.
func Production() Options {
	return Options{Fsync: true, Settings: map[string]string{
		"shared_buffers":     "512MB",
		"wal_buffers":        "16MB",
		"max_wal_size":       "4GB",
		"min_wal_size":       "512MB",
		"checkpoint_timeout": "15min",
		"synchronous_commit": "on",
	}}
}

// Cluster is a PostgreSQL cluster owned by this process. Its methods are
// safe for concurrent use.
type Cluster struct {
	// URL connects as superuser "postgres" to database "postgres" over TCP.
	URL string
	// DataDir is the cluster's data directory.
	DataDir string
	// SocketDir holds the server's unix socket (.s.PGSQL.<Port>).
	SocketDir string
	// Port is the TCP (and unix socket) port.
	Port int
	// BinDir holds the PostgreSQL binaries in use.
	BinDir string

	root    string // removed by Close; parent of DataDir, also SocketDir
	logPath string
	log     io.Writer
	owner   owner

	mu     sync.Mutex
	run    *serverRun // nil when stopped
	closed bool
}

// serverRun is one postmaster process started by us.
type serverRun struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returns
	err    error         // cmd.Wait's result, valid after exited is closed
}

const (
	// startTimeout bounds waiting for readiness when ctx has no deadline;
	// crash recovery after an immediate stop under load can take a while.
	startTimeout = 2 * time.Minute
	stopTimeout  = time.Minute
	logTailBytes = 8 << 10
)

// Available reports, without starting anything, whether Start could run
// here: ErrNoBinaries without the server's programs, ErrNoUser when running
// as root with no "postgres" account to run the server as. A nil error does
// not promise the start succeeds.
func Available() error {
	if _, err := FindBinaries(); err != nil {
		return err
	}
	_, err := serverOwner()
	return err
}

// Start creates a new cluster with initdb, starts it and waits until it
// accepts connections. ctx bounds only the start-up; the server keeps
// running until Stop or Close.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	bin := o.BinDir
	if bin == "" {
		var err error
		if bin, err = FindBinaries(); err != nil {
			return nil, err
		}
	}
	own, err := serverOwner()
	if err != nil {
		return nil, err
	}
	// A short root keeps the socket path well under the ~107 byte limit
	// of sun_path, whatever TMPDIR is.
	base := "/tmp"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = os.TempDir()
	}
	root, err := os.MkdirTemp(base, "pg")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{
		DataDir:   filepath.Join(root, "data"),
		SocketDir: root,
		BinDir:    bin,
		root:      root,
		log:       o.Log,
		owner:     own,
	}
	c.logPath = filepath.Join(c.DataDir, "server.log")
	if c.log == nil {
		c.log = io.Discard
	}
	if err := c.create(ctx, o); err != nil {
		_ = os.RemoveAll(root)
		return nil, err
	}
	return c, nil
}

// create runs initdb, writes the configuration and starts the server,
// retrying with another port if the free one was grabbed meanwhile.
func (c *Cluster) create(ctx context.Context, o Options) error {
	if err := c.owner.chown(c.root); err != nil {
		return fmt.Errorf("pgcluster: chown %s: %w", c.root, err)
	}
	args := []string{"-D", c.DataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"}
	if !o.Fsync {
		args = append(args, "--no-sync")
	}
	t0 := time.Now()
	if out, err := c.command(ctx, "initdb", args...); err != nil {
		return fmt.Errorf("pgcluster: initdb: %w\n%s", err, out)
	}
	fmt.Fprintf(c.log, "pgcluster: initdb %s in %v\n", c.DataDir, time.Since(t0).Round(time.Millisecond))

	f, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_ = f.Close()
	if err := c.owner.chown(c.logPath); err != nil {
		return fmt.Errorf("pgcluster: chown %s: %w", c.logPath, err)
	}

	settings := baseSettings(o, c.SocketDir)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return fmt.Errorf("pgcluster: pick port: %w", err)
		}
		settings["port"] = strconv.Itoa(port)
		// Later lines in postgresql.conf win, so appending is enough,
		// also when retrying with a new port.
		if err := appendConf(filepath.Join(c.DataDir, "postgresql.conf"), settings); err != nil {
			return err
		}
		c.Port = port
		c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
		c.mu.Lock()
		lastErr = c.startLocked(ctx)
		c.mu.Unlock()
		if lastErr == nil || !strings.Contains(lastErr.Error(), "could not bind") || ctx.Err() != nil {
			return lastErr
		}
	}
	return lastErr
}

func baseSettings(o Options, socketDir string) map[string]string {
	onOff := "off"
	if o.Fsync {
		onOff = "on"
	}
	s := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": socketDir,
		// Room for several pools plus fault tests on a small box.
		"max_connections":           "200",
		"shared_buffers":            "128MB",
		"max_locks_per_transaction": "256", // DROP SCHEMA CASCADE of many partitions
		"fsync":                     onOff,
		// Torn pages only matter if the OS crashes, which fsync=off
		// already gives up on.
		"full_page_writes":   onOff,
		"synchronous_commit": "on",
		"logging_collector":  "off",
		"log_line_prefix":    "%m [%p] %q%a ",
		"lc_messages":        "C",
	}
	maps.Copy(s, o.Settings)
	return s
}

func appendConf(path string, settings map[string]string) error {
	var b strings.Builder
	b.WriteString("\n# pgcluster\n")
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(settings[k], "'", "''"))
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgcluster: write %s: %w", path, err)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start restarts a stopped cluster on the same data directory and port,
// waiting until it accepts connections (after crash recovery, if it was
// stopped with "immediate").
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.run != nil {
		select {
		case <-c.run.exited:
			// Died on its own; starting again is what the caller wants.
			c.run = nil
		default:
			return errors.New("pgcluster: cluster is already running")
		}
	}
	return c.startLocked(ctx)
}

// startLocked runs postgres directly rather than through pg_ctl so that
// it is our child: we can reap it, and give it a parent-death signal.
func (c *Cluster) startLocked(ctx context.Context) error {
	t0 := time.Now()
	logf, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: open server log: %w", err)
	}
	logStart := fileSize(c.logPath)
	cmd := exec.Command(filepath.Join(c.BinDir, "postgres"), "-D", c.DataDir)
	cmd.Dir = c.root
	cmd.Env = childEnv()
	// An *os.File is handed to the child as is: no copying goroutines.
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = c.owner.sysProcAttr(true)
	err = cmd.Start()
	_ = logf.Close()
	if err != nil {
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	r := &serverRun{cmd: cmd, exited: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		close(r.exited)
	}()

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	if err := c.waitReady(ctx, r); err != nil {
		c.kill(r)
		return fmt.Errorf("pgcluster: start postgres on port %d: %w\nserver log:\n%s", c.Port, err, c.logSince(logStart))
	}
	c.run = r
	fmt.Fprintf(c.log, "pgcluster: postgres pid %d ready at %s in %v\n", cmd.Process.Pid, c.URL, time.Since(t0).Round(time.Millisecond))
	return nil
}

// waitReady polls postmaster.pid the way pg_ctl -w does: the postmaster
// writes "ready" into it once it accepts connections.
func (c *Cluster) waitReady(ctx context.Context, r *serverRun) error {
	pidFile := filepath.Join(c.DataDir, "postmaster.pid")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if b, err := os.ReadFile(pidFile); err == nil {
			lines := strings.Split(string(b), "\n")
			// Line 1 is the pid, line 8 the status (PostgreSQL 10+).
			if len(lines) >= 8 && strings.TrimSpace(lines[0]) == strconv.Itoa(r.cmd.Process.Pid) &&
				strings.TrimSpace(lines[7]) == "ready" {
				return nil
			}
		}
		select {
		case <-r.exited:
			return fmt.Errorf("postgres exited during start-up: %v", r.err)
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// Stop stops the server: mode "fast" (roll back sessions, checkpoint)
// or "immediate" (like a crash; the next Start runs recovery). The
// cluster can be started again. Stopping a stopped cluster is a no-op;
// if the server had died on its own, Stop reports that.
func (c *Cluster) Stop(mode string) error {
	if mode != "fast" && mode != "immediate" {
		return fmt.Errorf("pgcluster: unknown stop mode %q (want fast or immediate)", mode)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopLocked(mode)
}

func (c *Cluster) stopLocked(mode string) error {
	r := c.run
	if r == nil {
		return nil
	}
	c.run = nil
	select {
	case <-r.exited:
		return fmt.Errorf("%w: %v\nserver log tail:\n%s", errExited, r.err, c.logTail())
	default:
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	out, err := c.command(ctx, "pg_ctl", "stop", "-D", c.DataDir, "-m", mode, "-w", "-t", strconv.Itoa(int(stopTimeout/time.Second)))
	if err != nil {
		// E.g. a damaged pid file: signal our child directly instead.
		fmt.Fprintf(c.log, "pgcluster: pg_ctl stop -m %s: %v\n%s", mode, err, out)
		sig := sigFast
		if mode == "immediate" {
			sig = sigImmediate
		}
		_ = signalProcess(r.cmd.Process.Pid, sig)
	}
	select {
	case <-r.exited:
	case <-time.After(stopTimeout):
		c.kill(r)
		return fmt.Errorf("pgcluster: postgres did not stop (%s); killed it\npg_ctl: %v\n%s", mode, err, out)
	}
	fmt.Fprintf(c.log, "pgcluster: stopped (%s) in %v\n", mode, time.Since(t0).Round(time.Millisecond))
	return nil
}

// kill ends a server that failed to start or stop and reaps it. An
// immediate shutdown comes first so the postmaster takes its backends
// down; they sit in their own sessions, out of reach of a group signal,
// and otherwise only exit once they notice the postmaster is gone.
func (c *Cluster) kill(r *serverRun) {
	_ = signalProcess(r.cmd.Process.Pid, sigImmediate)
	select {
	case <-r.exited:
		return
	case <-time.After(5 * time.Second):
	}
	_ = signalProcess(r.cmd.Process.Pid, sigKill)
	<-r.exited
}

// Pid is the running postmaster's process id, or 0 while the server is
// stopped (benchmarks read its CPU time and its children's from /proc).
func (c *Cluster) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run == nil {
		return 0
	}
	return c.run.cmd.Process.Pid
}

// Close stops the server (immediate) and removes all the cluster's
// files. It is idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	stopErr := c.stopLocked("immediate")
	if errors.Is(stopErr, errExited) {
		// Nothing left to stop; the cluster is going away anyway.
		stopErr = nil
	}
	rmErr := os.RemoveAll(c.root)
	if rmErr != nil {
		rmErr = fmt.Errorf("pgcluster: remove %s: %w", c.root, rmErr)
	}
	return errors.Join(stopErr, rmErr)
}

// ServerLog returns the server's log so far (empty after Close).
func (c *Cluster) ServerLog() string {
	b, _ := os.ReadFile(c.logPath)
	return string(b)
}

func (c *Cluster) logTail() string { return c.logSince(0) }

// logSince returns what the server logged after offset, at most the last
// logTailBytes of it.
func (c *Cluster) logSince(offset int64) string {
	b, _ := os.ReadFile(c.logPath)
	if offset > int64(len(b)) {
		offset = 0
	}
	b = b[offset:]
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
		b = append([]byte("...\n"), b...)
	}
	return string(b)
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// command runs a short-lived PostgreSQL tool as the cluster's owner and
// returns its combined output, also copied to the Log writer.
func (c *Cluster) command(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, name), args...)
	// The owner may not be able to enter our working directory (e.g.
	// /root), which initdb and pg_ctl treat as fatal.
	cmd.Dir = c.root
	cmd.Env = childEnv()
	cmd.SysProcAttr = c.owner.sysProcAttr(false)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	_, _ = c.log.Write(out.Bytes())
	return out.Bytes(), err
}

// childEnv drops PG* variables (PGDATA, PGPORT, ...) so the caller's
// client settings cannot redirect the tools or the server.
func childEnv() []string {
	env := os.Environ()
	return slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PG") })
}

// URLFromEnv returns the database URL in the environment variable env, or
// starts a throwaway cluster with o when it is unset. stop closes what was
// started (a no-op for a URL from the environment). started tells the
// caller which happened, e.g. to say so.
func URLFromEnv(ctx context.Context, env string, o Options) (url string, stop func(), started bool, err error) {
	if u := os.Getenv(env); u != "" {
		return u, func() {}, false, nil
	}
	c, err := Start(ctx, o)
	if err != nil {
		return "", nil, false, err
	}
	return c.URL, func() { _ = c.Close() }, true, nil
}
