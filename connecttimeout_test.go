package queen_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// blackhole forwards TCP connections to a server until hang is called:
// then it drops the forwarded ones and accepts new ones without ever
// answering, as a host that went away behind a load balancer would.
type blackhole struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	hanging bool
	conns   []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	go b.serve()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		b.conns = append(b.conns, c)
		hanging := b.hanging
		b.mu.Unlock()
		if hanging {
			continue // held open, never answered
		}
		go func() {
			s, err := net.Dial("tcp", b.target)
			if err != nil {
				c.Close()
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, s)
			b.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			_, _ = io.Copy(c, s)
			c.Close()
		}()
	}
}

func (b *blackhole) setHanging(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hanging = on
	for _, c := range b.conns {
		c.Close()
	}
	b.conns = nil
}

func (b *blackhole) close() {
	b.ln.Close()
	b.setHanging(false)
}

// Open's own pool connects within StatementTimeout: with pgx's default
// connect timeout (2 minutes) a call during an outage whose host accepts
// connections but never answers hung that long, whatever StatementTimeout
// said.
func TestOwnPoolConnectTimeoutDuringOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	const timeout = time.Second
	bound := timeout + 2*time.Second // a loaded machine
	pc, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cc := pc.ConnConfig
	bh := newBlackhole(t, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	u := url.URL{Scheme: "postgres", User: url.UserPassword(cc.User, cc.Password), Host: bh.ln.Addr().String(),
		Path: "/" + cc.Database, RawQuery: "sslmode=disable"}
	c := open(t, func(cfg *queen.Config) { cfg.DatabaseURL, cfg.StatementTimeout = u.String(), timeout })
	t.Cleanup(func() { bh.setHanging(false) }) // before the client closes
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("before")})

	bh.setHanging(true)
	c.Pool().Reset() // every call now needs a new connection
	for i := range 2 {
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := q.Peek(context.Background(), queen.PeekOptions{})
			done <- err
		}()
		select {
		case err := <-done:
			took := time.Since(start)
			t.Logf("call %d during the outage: %v after %s", i, err, took)
			if err == nil {
				t.Fatalf("call %d during the outage succeeded", i)
			}
			if took > bound {
				t.Fatalf("call %d during the outage returned after %s, want within %s", i, took, bound)
			}
		case <-time.After(10 * bound):
			t.Fatalf("call %d during the outage still blocked after %s (StatementTimeout %s)", i, 10*bound, timeout)
		}
	}
	bh.setHanging(false)
	if got := fmt.Sprint(datas(peek(t, q, queen.PeekOptions{}))); got != "[before]" {
		t.Fatalf("after the outage: %s", got)
	}
}
