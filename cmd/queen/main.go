// Command queen operates a queen schema: migrations, queues, messages,
// dead letters, pausing consumer groups, maintenance mode, and a web
// dashboard. Run "queen help" for the commands and exit codes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/connstr"
	"github.com/e03140bc/queen/sqlschema"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1 // the command failed (database, I/O)
	exitUsage    = 2 // bad command line: unknown command or flag, missing argument, invalid value
	exitNotFound = 3 // the queue named does not exist
	exitSchema   = 4 // the schema is not at this binary's version (validate; every command but migrate-*)
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand.
type command struct {
	name     string
	synopsis string // arguments after the name
	short    string
	long     string
	run      func(e *env, fs *flag.FlagSet, args []string) int
	// flags registers the command's own flags.
	flags func(fs *flag.FlagSet, o *opts)
}

// opts holds every flag; each command registers the ones it reads.
type opts struct {
	url, schema, tenant string
	json                bool

	from, to, version int
	partition         string
	groups            []string
	groupSet          bool
	group             string
	follow            bool
	limit             int
	interval          time.Duration
	since, until      string
	after             int64
	ids               []int64
	dryRun            bool
	addr              string
	actions           bool
	refresh           time.Duration
	resetTo           string
	offsets           []string
	partitions        []string
	force             bool
	citus             bool
}

// env is one run's context.
type env struct {
	ctx            context.Context
	stdout, stderr io.Writer
	cmd            *command
	o              opts
}

var commands []*command

func init() {
	commands = []*command{
		cmdMigrateUp, cmdMigrateGet, cmdValidate,
		cmdQueues, cmdStatus, cmdTail, cmdDLQ, cmdPause, cmdResume, cmdGroup, cmdLease, cmdMaintenance, cmdServe,
	}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

const usageHead = `queen operates a queen schema in PostgreSQL.

Usage:
  queen [global flags] <command> [arguments] [flags]

Commands:
`

const usageTail = `
Global flags (before or after the command):
  --database-url URL  the database (default $QUEEN_DATABASE_URL)
  --schema NAME       the queen schema (default "queen")
  --tenant UUID       the tenant whose queues to reach (default the nil UUID)
  --json              machine-readable output (JSON; tail writes one object per line)

Exit codes:
  0  success (also: nothing to replay, an interrupted tail --follow)
  1  the command failed (database unreachable, query failed)
  2  usage: unknown command or flag, missing argument, invalid value
  3  not found: the queue named does not exist (group, lease: nor the
     partition or group named)
  4  the schema is not at this binary's version: run "queen migrate-up"
     (or, if the database is newer, upgrade this binary)

Run "queen help <command>" for a command's flags.
`

func usage(w io.Writer) {
	fmt.Fprint(w, usageHead)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.short)
	}
	fmt.Fprint(w, usageTail)
}

func commandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: queen %s %s\n\n%s\n", c.name, c.synopsis, c.short)
	if c.long != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.long))
	}
	fmt.Fprintln(w, "\nFlags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	fmt.Fprintln(w, "\nExit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 schema not at this binary's version (see \"queen help\").")
}

// run is the whole program: it parses args, runs a command and returns
// the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{ctx: ctx, stdout: stdout, stderr: stderr}
	top := flag.NewFlagSet("queen", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	globalFlags(top, &e.o)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return exitOK
		}
		fmt.Fprintf(stderr, "queen: %v\n\n", err)
		usage(stderr)
		return exitUsage
	}
	rest := top.Args()
	if len(rest) == 0 {
		fmt.Fprint(stderr, "queen: no command given\n\n")
		usage(stderr)
		return exitUsage
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		if len(rest) == 0 {
			usage(stdout)
			return exitOK
		}
		c := lookup(rest[0])
		if c == nil {
			fmt.Fprintf(stderr, "queen help: unknown command %s\n\n", shown(rest[0]))
			usage(stderr)
			return exitUsage
		}
		commandUsage(stdout, c, e.flagSet(c))
		return exitOK
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(stderr, "queen: unknown command %s\n\n", shown(name))
		usage(stderr)
		return exitUsage
	}
	e.cmd = c
	fs := e.flagSet(c)
	pos, err := parseInterleaved(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandUsage(stdout, c, fs)
			return exitOK
		}
		return e.usageError("%v", err)
	}
	return c.run(e, fs, pos)
}

func globalFlags(fs *flag.FlagSet, o *opts) {
	fs.StringVar(&o.url, "database-url", o.url, "the database `URL` (default $QUEEN_DATABASE_URL)")
	fs.StringVar(&o.schema, "schema", o.schema, "the queen `schema` (default \"queen\")")
	fs.StringVar(&o.tenant, "tenant", o.tenant, "the tenant `UUID` whose queues to reach (default the nil UUID)")
	fs.BoolVar(&o.json, "json", o.json, "machine-readable output")
}

// flagSet is c's flags plus the global ones, which may follow the command.
func (e *env) flagSet(c *command) *flag.FlagSet {
	fs := flag.NewFlagSet("queen "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if c.flags != nil {
		c.flags(fs, &e.o)
	}
	globalFlags(fs, &e.o)
	return fs
}

// parseInterleaved parses flags wherever they stand among the positional
// arguments ("queen status orders --json"); "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		// The flag package stops at "--" and drops it: find out whether it did.
		dd := -1
		for i, a := range args {
			if a == "--" {
				dd = i
				break
			}
			if !strings.HasPrefix(a, "-") || a == "-" {
				break
			}
		}
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if dd >= 0 && len(rest) == len(args)-dd-1 {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// usageError reports a bad command line: the message, then the command's
// usage, on stderr.
func (e *env) usageError(format string, a ...any) int {
	fmt.Fprintf(e.stderr, "queen %s: %s\n\n", e.cmd.name, fmt.Sprintf(format, a...))
	commandUsage(e.stderr, e.cmd, e.flagSet(e.cmd))
	return exitUsage
}

// errorf reports a failure with what to do about it.
func (e *env) errorf(code int, format string, a ...any) int {
	fmt.Fprintf(e.stderr, "queen %s: %s\n", e.cmd.name, fmt.Sprintf(format, a...))
	return code
}

// fail reports err, choosing the exit code and a hint from what it is.
func (e *env) fail(err error) int {
	if code, ok := e.failOffsets(err); ok {
		return code
	}
	switch {
	case errors.Is(err, queen.ErrInvalidName):
		return e.errorf(exitUsage, "%v (names are 1-255 bytes of UTF-8 without control characters)", err)
	case errors.Is(err, queen.ErrEncryption):
		return e.errorf(exitError, "%v (this command has no encryption key: encrypted payloads cannot be shown)", err)
	case errors.Is(err, context.Canceled):
		return e.errorf(exitError, "interrupted")
	}
	return e.errorf(exitError, "%v", err)
}

// shown quotes a command-line word for an error message, unless it looks
// like a database connection string given in the wrong place: that may
// hold a password.
func shown(s string) string {
	l := strings.ToLower(s)
	if strings.HasPrefix(l, "postgres://") || strings.HasPrefix(l, "postgresql://") || strings.Contains(l, "password=") {
		return "(a database URL, not shown: pass it with --database-url)"
	}
	return strconv.Quote(s)
}

// args checks the number of positional arguments.
func (e *env) args(pos []string, n int) (int, bool) {
	if len(pos) < n {
		return e.usageError("missing argument: want %s", e.cmd.synopsis), false
	}
	if len(pos) > n {
		return e.usageError("unexpected argument %s", shown(pos[n])), false
	}
	return 0, true
}

// subcommand checks "SUB QUEUE" in pos, SUB one of subs, and returns both.
func (e *env) subcommand(pos []string, subs ...string) (sub, queue string, code int, ok bool) {
	want := strings.Join(subs, ", ")
	if i := strings.LastIndex(want, ", "); i >= 0 {
		want = want[:i] + " or " + want[i+2:]
	}
	if len(pos) == 0 {
		return "", "", e.usageError("missing subcommand: %s", want), false
	}
	if !slices.Contains(subs, pos[0]) {
		return "", "", e.usageError("unknown subcommand %s: want %s", shown(pos[0]), want), false
	}
	if code, ok := e.args(pos[1:], 1); !ok {
		return "", "", code, false
	}
	return pos[0], pos[1], 0, true
}

func (e *env) schema() string {
	if e.o.schema == "" {
		return "queen"
	}
	return e.o.schema
}

// pool connects to the database without touching the schema.
func (e *env) pool(maxConns int32) (*pgxpool.Pool, int) {
	url, source := e.o.url, "--database-url"
	if url == "" {
		url, source = os.Getenv("QUEEN_DATABASE_URL"), "QUEEN_DATABASE_URL"
	}
	if url == "" {
		return nil, e.errorf(exitUsage, "no database: pass --database-url or set QUEEN_DATABASE_URL")
	}
	if err := sqlschema.ValidSchema(e.schema()); err != nil {
		return nil, e.errorf(exitUsage, "--schema: %v (a lower-case identifier of at most 63 bytes)", err)
	}
	// Never the URL itself: it may hold a password.
	cfg, err := connstr.ParseConfig(url)
	if err != nil {
		return nil, e.errorf(exitUsage, "%s: %v", source, err)
	}
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = p.Ping(ctx)
		if err != nil {
			p.Close()
		}
	}
	if err != nil {
		return nil, e.errorf(exitError, "cannot reach the database: %v (check --database-url or QUEEN_DATABASE_URL)", err)
	}
	return p, exitOK
}

// schemaState compares the schema's applied migrations with this binary's.
type schemaState struct {
	Schema  string `json:"schema"`
	Version int    `json:"version"`
	Latest  int    `json:"latest"`
	Pending []int  `json:"pending"`
	OK      bool   `json:"ok"`
	Problem string `json:"problem,omitempty"`
	Hint    string `json:"hint,omitempty"`
}

func readSchemaState(ctx context.Context, p *pgxpool.Pool, schema string) (schemaState, error) {
	st := schemaState{Schema: schema, Latest: sqlschema.Latest(), Pending: []int{}}
	applied, err := sqlschema.Version(ctx, p, schema)
	if err != nil {
		return st, err
	}
	ms := sqlschema.Migrations()
	for i, a := range applied {
		st.Version = a.Version
		switch {
		case a.Version > len(ms):
			st.Problem = fmt.Sprintf("the database is at version %d, newer than this binary (%d)", applied[len(applied)-1].Version, st.Latest)
			st.Hint = "upgrade this queen binary"
			st.Version = applied[len(applied)-1].Version
			return st, nil
		case a.Version != i+1:
			st.Problem = fmt.Sprintf("the version table has a gap: version %d at position %d", a.Version, i+1)
			st.Hint = "inspect " + schema + ".schema_migrations"
			return st, nil
		case a.Checksum != ms[i].Checksum:
			st.Problem = fmt.Sprintf("applied migration %d (%s) differs from this binary's", a.Version, ms[i].Name)
			st.Hint = "the database was migrated by another build of queen: use that build"
			return st, nil
		}
	}
	for v := st.Version + 1; v <= st.Latest; v++ {
		st.Pending = append(st.Pending, v)
	}
	switch {
	case len(applied) == 0:
		st.Problem = fmt.Sprintf("schema %q has no queen tables", schema)
		st.Hint = "check --schema, or run \"queen migrate-up\" to create them"
	case len(st.Pending) > 0:
		st.Problem = fmt.Sprintf("schema %q is at version %d, this binary needs %d", schema, st.Version, st.Latest)
		st.Hint = "run \"queen migrate-up\""
	default:
		st.OK = true
	}
	return st, nil
}

// client opens a queen client on a schema that is already at this
// binary's version: no command but migrate-up changes the schema. It
// runs no maintenance and spools into a private directory it removes.
func (e *env) client(maxConns int32) (*queen.Client, func(), int) {
	p, code := e.pool(maxConns)
	if code != exitOK {
		return nil, nil, code
	}
	st, err := readSchemaState(e.ctx, p, e.schema())
	if err != nil {
		p.Close()
		return nil, nil, e.errorf(exitError, "read the schema version: %v", err)
	}
	if !st.OK {
		p.Close()
		return nil, nil, e.errorf(exitSchema, "%s: %s", st.Problem, st.Hint)
	}
	tenant := queen.DefaultTenant
	if e.o.tenant != "" {
		if tenant, err = uuid.FromString(e.o.tenant); err != nil {
			p.Close()
			return nil, nil, e.errorf(exitUsage, "--tenant: %q is not a UUID", e.o.tenant)
		}
	}
	dir, err := os.MkdirTemp("", "queen-cli-spool-")
	if err != nil {
		p.Close()
		return nil, nil, e.errorf(exitError, "spool directory: %v", err)
	}
	c, err := queen.Open(e.ctx, queen.Config{
		Pool: p, Schema: e.schema(), Tenant: tenant, SpoolDir: dir,
		Maintenance: queen.MaintenanceConfig{Interval: -1},
		Logger:      slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		p.Close()
		os.RemoveAll(dir)
		return nil, nil, e.errorf(exitError, "open: %v", err)
	}
	return c, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 10*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			fmt.Fprintf(e.stderr, "queen %s: close: %v\n", e.cmd.name, err)
		}
		p.Close()
		os.RemoveAll(dir)
	}, exitOK
}

// queueExists tells a missing queue from one with no partitions, which
// Queue.Status cannot: Client.Queues lists the queues that exist.
func queueExists(ctx context.Context, c *queen.Client, name string) (bool, error) {
	qs, err := c.Queues(ctx)
	if err != nil {
		return false, err
	}
	for _, q := range qs {
		if q.Name == name {
			return true, nil
		}
	}
	return false, nil
}

// mustQueue checks that the queue exists, reporting exit 3 if not.
func (e *env) mustQueue(c *queen.Client, name string) int {
	if !queen.ValidName(name) {
		return e.errorf(exitUsage, "invalid queue name %s: names are 1-%d bytes of UTF-8 without control characters", shown(name), queen.MaxNameLen)
	}
	ok, err := queueExists(e.ctx, c, name)
	if err != nil {
		return e.fail(err)
	}
	if !ok {
		return e.errorf(exitNotFound, "no queue %s in schema %q (\"queen queues\" lists them)", shown(name), c.Schema())
	}
	return exitOK
}

func (e *env) writeJSON(v any) int {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return e.errorf(exitError, "write: %v", err)
	}
	return exitOK
}
