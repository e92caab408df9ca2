package queen

import (
	"context"
	"sync/atomic"

	"github.com/e03140bc/queen/spool"
)

// SlowSpoolWrites is an option for Open in tests: while slow is set, every
// spool write of the client outlasts a deadline of the caller's (the
// records are written and synced, and an Append with a deadline reports it
// exceeded), as when the disk is slow.
func SlowSpoolWrites(slow *atomic.Bool) func(*Config) {
	return func(c *Config) {
		c.testKnobs().spoolAppend = func(s *spool.Spool, ctx context.Context, recs []spool.Record) error {
			if !slow.Load() {
				return s.Append(ctx, recs)
			}
			if err := s.Append(context.WithoutCancel(ctx), recs); err != nil {
				return err
			}
			if _, ok := ctx.Deadline(); ok {
				return context.DeadlineExceeded
			}
			return nil
		}
	}
}
