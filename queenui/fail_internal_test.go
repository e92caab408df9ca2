package queenui

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen/queentest"
)

// An error that carries a connection string (pgx's parse error, which
// quotes it) is neither shown on the page nor logged with any part of it.
func TestFailNeverShowsAConnectionString(t *testing.T) {
	c := queentest.Open(t)
	var logs bytes.Buffer
	h := New(c, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}).(*handler)
	const password = "S3cr@tPW"
	for _, url := range []string{
		"postgres://alice:S3cr@tPW@localhost:badport/db",
		"postgres://alice:S3cr@tPW@localhost/db?sslmode=bogus",
		"host=localhost password=S3cr@tPW port=bad",
	} {
		logs.Reset()
		err := fmt.Errorf("queen: reconnect: %w", pgconn.NewParseConfigError(url, "invalid port", nil))
		w := httptest.NewRecorder()
		h.fail(w, httptest.NewRequest("GET", "/", nil), "queues", err)
		for i := 0; i+3 <= len(password); i++ {
			p := password[i : i+3]
			if strings.Contains(w.Body.String(), p) {
				t.Errorf("%q: the page shows %q of the password:\n%s", url, p, w.Body.String())
			}
			if strings.Contains(logs.String(), p) {
				t.Errorf("%q: the log shows %q of the password:\n%s", url, p, logs.String())
			}
		}
		if !strings.Contains(w.Body.String(), "invalid port") {
			t.Errorf("%q: the page does not say what is wrong:\n%s", url, w.Body.String())
		}
	}
}
