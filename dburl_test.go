package queen_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// leaked reports the first piece (3 bytes or more) of secret found in s.
func leaked(s, secret string) string {
	for i := 0; i+3 <= len(secret); i++ {
		if strings.Contains(s, secret[i:i+3]) {
			return secret[i : i+3]
		}
	}
	return ""
}

// A database URL that does not parse, or parses into a host or database
// name holding part of the password (an '@' or '/' not percent-encoded),
// fails Open with an error that names the problem and shows no part of
// the URL; nothing of it is logged either.
func TestOpenNeverShowsTheDatabaseURL(t *testing.T) {
	for _, tc := range []struct{ url, password, want string }{
		{"postgres://alice:S3cr@tPW@localhost:badport/db", "S3cr@tPW", "invalid port"},
		{"postgres://alice:S3cr@tPW@localhost/db?sslmode=bogus", "S3cr@tPW", "sslmode"},
		{"postgres://alice:S3cr%40tPW@localhost/db?sslmode=bogus", "S3cr%40tPW", "sslmode"},
		{"postgres://alice:S3cr%tPW@localhost/db", "S3cr%tPW", "URL"},
		{"postgres://alice:S3cr@t PW@localhost/db", "S3cr@t PW", "URL"},
		{"postgres://alice:S3cr@tPW@[::1/db", "S3cr@tPW", ""},
		{"alice:S3cr@tPW@localhost/db", "S3cr@tPW", ""},
		{"host=localhost password=S3cr3t Pa55 port=5432", "S3cr3t Pa55", ""},
		{"host=localhost password=S3cr3tPa55 port=bad", "S3cr3tPa55", "invalid port"},
		{"postgres://alice:S3cr@tPW@127.0.0.1:1/db?connect_timeout=2", "S3cr@tPW", "@"},
		{"postgres://alice:12/34tPW@127.0.0.1:1/db?connect_timeout=2", "12/34tPW", "@"},
	} {
		var logs bytes.Buffer
		ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Second)
		c, err := queen.Open(ctx, queen.Config{DatabaseURL: tc.url, Schema: "never_opened", SpoolDir: t.TempDir(),
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		cancel()
		if err == nil {
			c.Close(context.Background())
			t.Errorf("%q: Open succeeded", tc.url)
			continue
		}
		if p := leaked(err.Error(), tc.password); p != "" {
			t.Errorf("%q: the error shows %q of the password: %v", tc.url, p, err)
		}
		if p := leaked(logs.String(), tc.password); p != "" {
			t.Errorf("%q: the log shows %q of the password:\n%s", tc.url, p, logs.String())
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: the error %q does not say what is wrong (%q)", tc.url, err, tc.want)
		}
	}
}
