package queen

import (
	"context"

	"github.com/e03140bc/queen/spool"
)

// SlowSpoolWrites makes every spool write outlast a deadline of the
// caller's: the records are written and synced, and an Append with a
// deadline reports it exceeded, as when the disk is slow. It returns a func
// restoring Append. Tests that use it must not run in parallel with others.
func SlowSpoolWrites() (restore func()) {
	old := spoolAppend
	spoolAppend = func(s *spool.Spool, ctx context.Context, recs []spool.Record) error {
		if err := s.Append(context.WithoutCancel(ctx), recs); err != nil {
			return err
		}
		if _, ok := ctx.Deadline(); ok {
			return context.DeadlineExceeded
		}
		return nil
	}
	return func() { spoolAppend = old }
}
