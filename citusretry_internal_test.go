package queen

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// On the Citus layout a call aborted as a deadlock runs again, at most
// citusDeadlockRetries times; any other error, and every error on
// PostgreSQL, is returned at once.
func TestOnLayoutRetriesDeadlocksOnCitusOnly(t *testing.T) {
	deadlock := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: codeDeadlock})
	other := &pgconn.PgError{Code: "23503"}
	for _, c := range []struct {
		citus     bool
		errs      []error // what each call returns; nil once they run out
		wantCalls int
		wantErr   error
	}{
		{true, []error{deadlock, deadlock}, 3, nil},
		{true, []error{other}, 1, other},
		{false, []error{deadlock}, 1, deadlock},
		{true, []error{deadlock, deadlock, deadlock, deadlock, deadlock, deadlock, deadlock}, citusDeadlockRetries + 1, deadlock},
	} {
		e := &engine{}
		e.cfg.Citus = c.citus
		calls := 0
		err := e.onLayout(context.Background(), func() error {
			calls++
			if calls <= len(c.errs) {
				return c.errs[calls-1]
			}
			return nil
		})
		if calls != c.wantCalls || !errors.Is(err, c.wantErr) {
			t.Errorf("citus %v, errors %v: %d calls, err %v; want %d calls, err %v", c.citus, c.errs, calls, err, c.wantCalls, c.wantErr)
		}
	}
	// A cancelled context ends the waits between tries.
	e := &engine{}
	e.cfg.Citus = true
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	if err := e.onLayout(ctx, func() error { calls++; return deadlock }); calls != 1 || !errors.Is(err, deadlock) {
		t.Errorf("cancelled: %d calls, err %v", calls, err)
	}
}
