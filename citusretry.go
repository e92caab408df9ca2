package queen

import (
	"context"
	"time"
)

// codeDeadlock is PostgreSQL's SQLSTATE for a transaction aborted to
// break a deadlock.
const codeDeadlock = "40P01"

// citusDeadlockRetries bounds onLayout's retries of one call.
const citusDeadlockRetries = 5

// onLayout runs call, one statement in a transaction of its own, and on
// the Citus layout (Config.Citus) runs it again when it was aborted to
// break a deadlock. There a write to a reference table locks that table's
// shard, and the queues shard it references, on every node, whatever rows
// it touches: two operator calls that each hold a row of one and then
// write another wait for each other, where PostgreSQL's row locks would
// let both through. The aborted call rolled back whole, so running it
// again is the call as the caller asked it. Every operator call that writes
// a reference table goes through it: ResetGroup, DeleteGroup, ReleaseLease,
// Queue.Delete, Pause, Resume, DiscardDeadLetters, RequeueDeadLetters.
func (e *engine) onLayout(ctx context.Context, call func() error) error {
	for n := 0; ; n++ {
		err := call()
		if err == nil || !e.cfg.Citus || n == citusDeadlockRetries || !isCode(err, codeDeadlock) {
			return err
		}
		// Apart, so the two do not meet again at once.
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(20<<n) * time.Millisecond):
		}
	}
}
