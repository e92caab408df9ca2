// Package connstr parses database connection strings (URLs or key=value
// settings) for a pool without ever showing them: a string that does not
// parse may hold a password where the parser did not expect one (an '@'
// or '/' not percent-encoded), so no error quotes any part of it.
package connstr

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Error is a connection string's problem, in words of its own.
type Error struct{ Problem string }

func (e *Error) Error() string { return e.Problem }

// ParseConfig is pgxpool.ParseConfig with an *Error that quotes nothing.
// It also refuses a URL whose host or database name holds an '@': the
// parser took an earlier '@' (or a '/') inside the password for a
// separator, so connection errors would show what follows it.
func ParseConfig(s string) (*pgxpool.Config, error) {
	isURL := strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
	cfg, err := pgxpool.ParseConfig(s)
	if err != nil {
		p, ok := Problem(err)
		if !ok {
			p = "cannot parse it"
		}
		if isURL && misplacedAt(s) {
			p += " (" + atHint + ")"
		}
		return nil, &Error{Problem: p}
	}
	if isURL && misplacedAt(s) {
		return nil, &Error{Problem: atHint}
	}
	return cfg, nil
}

const atHint = "an '@' where the host or database name should be: percent-encode '@' (%40), '/' (%2F) and ':' (%3A) in the user name and password"

// misplacedAt reports an '@' past the URL's user information, found as
// the parser finds it: the first '@' before any '/' ends it.
func misplacedAt(s string) bool {
	_, p, _ := strings.Cut(s, "://")
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		p = p[i+1:]
	}
	// The query's values may hold an '@' (application_name=a@b).
	p, _, _ = strings.Cut(p, "?")
	return strings.Contains(p, "@")
}

// Problem describes err when it is pgx's connection string parse error
// (which quotes the string, redacted only on a best effort): what is
// wrong, without any part of the string. ok is false for other errors.
func Problem(err error) (problem string, ok bool) {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return "", false
	}
	// The message without the string; the wrapped error is left out too, as
	// some quote a piece of it.
	c := *pe
	c.ConnString = ""
	msg := c.Error()
	if inner := errors.Unwrap(pe); inner != nil {
		msg = strings.TrimSuffix(msg, " ("+inner.Error()+")")
	}
	msg = strings.TrimPrefix(msg, "cannot parse ``: ")
	switch {
	case msg == "failed to configure TLS":
		if inner := errors.Unwrap(pe); inner != nil && inner.Error() == "sslmode is invalid" {
			return "unknown sslmode (want disable, allow, prefer, require, verify-ca or verify-full)", true
		}
		return "invalid TLS settings (sslmode, sslrootcert, sslcert, sslkey)", true
	case msg == "failed to parse as URL":
		return "malformed URL: percent-encode special characters in the user name and password ('@' is %40, ':' %3A, '/' %2F, '%' %25, a space %20)", true
	case msg == "failed to parse as keyword/value":
		return "malformed: neither a URL (postgres://...) nor key=value settings (quote a value with spaces in single quotes)", true
	case strings.Contains(msg, "ConnStringAllowedKeys"):
		return "a setting that is not allowed", true
	}
	// Other messages name a setting, some then quote its value: keep the
	// words before any quote or value.
	if i := strings.IndexAny(msg, ":\"'`("); i >= 0 {
		msg = msg[:i]
	}
	msg = strings.TrimSpace(msg)
	for _, r := range msg {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == ' ') {
			msg = ""
			break
		}
	}
	if msg == "" {
		return "cannot parse it", true
	}
	return msg, true
}
