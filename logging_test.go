package queen_test

import (
	"bytes"
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
