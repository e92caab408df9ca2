package connstr

import (
	"errors"
	"strings"
	"testing"
)

// Every malformed string is refused with its problem named and no piece
// (3 bytes or more) of its password; a well-formed one parses.
func TestParseConfig(t *testing.T) {
	for _, tc := range []struct{ s, password, want string }{
		{"postgres://alice:S3cr@tPW@localhost:badport/db", "S3cr@tPW", "invalid port"},
		{"postgres://alice:S3cr@tPW@localhost/db?sslmode=bogus", "S3cr@tPW", "unknown sslmode"},
		{"postgres://alice:S3cr%tPW@localhost/db", "S3cr%tPW", "malformed URL"},
		{"postgres://alice:S3cr@t PW@localhost/db", "S3cr@t PW", "malformed URL"},
		{"postgres://alice:S3cr@tPW@[::1/db", "S3cr@tPW", "invalid port"},
		{"postgres://alice:S3cr@tPW@localhost/db?connect_timeout=tPW", "S3cr@tPW", "invalid connect_timeout"},
		{"postgres://alice:S3cr@tPW@localhost/db?target_session_attrs=tPWx", "S3cr@tPW", "unknown target_session_attrs value"},
		{"postgres://alice:S3cr@tPW@localhost/db?pool_max_conns=tPW", "S3cr@tPW", "cannot parse pool_max_conns"},
		{"postgres://alice:S3cr@tPW@localhost/db?%zz=1", "S3cr@tPW", "malformed URL"},
		{"alice:S3cr@tPW@localhost/db", "S3cr@tPW", "malformed"},
		{"host=localhost password=S3cr3t Pa55 port=5432", "S3cr3t Pa55", "malformed"},
		{"host=localhost password='S3cr3t Pa55 port=5432", "S3cr3t Pa55", "malformed"},
		{"host=localhost password=S3cr3tPa55 port=bad", "S3cr3tPa55", "invalid port"},
		// Parsed, but with part of the password as the host or database.
		{"postgres://alice:S3cr@tPW@127.0.0.1:1/db", "S3cr@tPW", "'@' where the host"},
		{"postgres://alice:12/34tPW@127.0.0.1:1/db", "12/34tPW", "'@' where the host"},
		{"postgresql://alice:S3cr@tPW@h1,h2/db", "S3cr@tPW", "'@' where the host"},
	} {
		_, err := ParseConfig(tc.s)
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%q: %v, want an *Error", tc.s, err)
			continue
		}
		for i := 0; i+3 <= len(tc.password); i++ {
			if p := tc.password[i : i+3]; strings.Contains(e.Problem, p) {
				t.Errorf("%q: %q shows %q of the password", tc.s, e.Problem, p)
			}
		}
		if !strings.Contains(e.Problem, tc.want) {
			t.Errorf("%q: %q, want %q", tc.s, e.Problem, tc.want)
		}
	}
	for _, s := range []string{
		"postgres://alice:S3cr%40tPW@localhost:5432/db?sslmode=disable",
		"postgres://alice:S3cr?tPW@localhost/db",
		"postgres://localhost/db?application_name=a@b",
		"postgresql://alice@h1:5432,h2:5433/db",
		"host=localhost password='S3cr@t PW' dbname=db",
	} {
		if _, err := ParseConfig(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	if _, ok := Problem(errors.New("other")); ok {
		t.Error("Problem described an error that is not a parse error")
	}
}
