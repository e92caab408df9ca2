package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/e03140bc/queen/queenui"
)

var cmdServe = &command{
	name:     "serve",
	synopsis: "[--addr HOST:PORT] [--actions] [--refresh D]",
	short:    "serve the web dashboard",
	long: `Serves the dashboard (package queenui) until interrupted: queues with depth and
throughput, charts of each queue's throughput and lag over the last hour (from
the samples the process running maintenance takes once a minute), partitions
with lag, lease holders and expiry, consumer groups, dead letters with a
payload preview, maintenance mode and this process's spool.

It is read-only unless --actions is given, which enables replaying and
discarding dead letters and pausing and resuming consumer groups (each with a
confirmation step, protected against cross-site request forgery). It has
no authentication: it listens on 127.0.0.1 by default. To reach it from
elsewhere, keep it on loopback and put an authenticating reverse proxy in front
(e.g. nginx with auth_basic or an OAuth proxy such as oauth2-proxy), or mount
queenui.New in your own server behind your own authentication.`,
	flags: func(fs *flag.FlagSet, o *opts) {
		fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen on this `address`")
		fs.BoolVar(&o.actions, "actions", false, "enable actions (replay or discard dead letters, pause or resume groups)")
		fs.DurationVar(&o.refresh, "refresh", 5*time.Second, "how often pages refresh in the browser (0: never)")
	},
	run: func(e *env, _ *flag.FlagSet, pos []string) int {
		if code, ok := e.args(pos, 0); !ok {
			return code
		}
		if e.o.refresh < 0 {
			return e.usageError("--refresh must not be negative")
		}
		host, _, err := net.SplitHostPort(e.o.addr)
		if err != nil {
			return e.usageError("--addr: %v", err)
		}
		c, done, code := e.client(8)
		if code != exitOK {
			return code
		}
		defer done()
		ln, err := net.Listen("tcp", e.o.addr)
		if err != nil {
			return e.errorf(exitError, "listen: %v (is the port taken? pick another with --addr)", err)
		}
		refresh := e.o.refresh
		if refresh == 0 {
			refresh = -1
		}
		srv := &http.Server{
			Handler:           queenui.New(c, queenui.Options{Actions: e.o.actions, Refresh: refresh}),
			ReadHeaderTimeout: 10 * time.Second,
		}
		mode := "read-only"
		if e.o.actions {
			mode = "actions on"
		}
		fmt.Fprintf(e.stdout, "queen: dashboard for schema %q on http://%s/ (%s); interrupt to stop\n", c.Schema(), ln.Addr(), mode)
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			fmt.Fprintf(e.stderr, "queen serve: warning: %s is reachable from other machines and the dashboard has no authentication: "+
				"put an authenticating proxy in front or listen on 127.0.0.1\n", e.o.addr)
		}
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			return e.errorf(exitError, "serve: %v", err)
		case <-e.ctx.Done():
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return e.errorf(exitError, "shutdown: %v", err)
		}
		return exitOK
	},
}
