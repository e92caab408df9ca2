package queen_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// lockedBuffer is a bytes.Buffer safe for the engine's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// Every log line names the client's schema (several clients may share a
// process), and the periodic bundle summary is Debug: Info is for events a
// person acts on.
func TestLogLinesCarrySchemaAndSummaryIsDebug(t *testing.T) {
	var buf lockedBuffer
	schema := pgtest.Schema(t)
	c := open(t, func(cfg *queen.Config) {
		cfg.Schema = schema
		cfg.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	queen.DueBundleSummary(c)
	push(t, c.Queue("logs"), queen.Item{Data: []byte("x")})
	var summary map[string]any
	lines := buf.lines()
	for _, l := range lines {
		if l["schema"] != schema {
			t.Errorf("log line without schema %q: %v", schema, l)
		}
		if l["msg"] == "queen: fusion bundle summary" {
			summary = l
		}
	}
	if summary == nil {
		t.Fatalf("no bundle summary among %d log lines", len(lines))
	}
	if summary["level"] != "DEBUG" {
		t.Errorf("bundle summary at %v, want DEBUG", summary["level"])
	}
}

// At Debug, Consume logs each batch it claims (partition, offsets, lease):
// with the handler's own records, what tells a claimed message from a
// handled one.
func TestConsumeLogsClaimsAtDebug(t *testing.T) {
	var buf lockedBuffer
	c := open(t, func(cfg *queen.Config) {
		cfg.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	q := c.Queue("q")
	pushN(t, q, "p", "m", 3)
	var leases []string
	var mu sync.Mutex
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g", Batch: 10}},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			leases = append(leases, m.LeaseID)
			mu.Unlock()
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return len(leases) >= 3 })
	if err != nil {
		t.Fatal(err)
	}
	var claims []map[string]any
	for _, l := range buf.lines() {
		if l["msg"] == "queen: consume claimed" {
			claims = append(claims, l)
		}
	}
	if len(claims) != 1 {
		t.Fatalf("%d claim lines, want 1: %v", len(claims), claims)
	}
	l := claims[0]
	if l["level"] != "DEBUG" || l["queue"] != "q" || l["group"] != "g" || l["partition"] != "p" ||
		l["first"] != 0.0 || l["last"] != 2.0 || l["messages"] != 3.0 || l["lease"] != leases[0] {
		t.Fatalf("claim line %v; the handler saw lease %s", l, leases[0])
	}
}
