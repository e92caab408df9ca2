// Package errs holds queen's error values, so that the engine's internal
// packages and the root share them without importing the root. The root
// re-exports the public ones under their documented names (queen.ErrClosed
// is errs.ErrClosed); see the root's errors.go for what each means.
package errs

import (
	"errors"
	"fmt"
)

// The public sentinels; the root documents them.
var (
	ErrClosed         = errors.New("queen: client closed")
	ErrInvalidName    = errors.New("queen: invalid name")
	ErrLeaseLost      = errors.New("queen: lease lost")
	ErrTooLarge       = errors.New("queen: too large")
	ErrEncryption     = errors.New("queen: encryption")
	ErrLanesFixed     = errors.New("queen: lane count is fixed once the queue has keyed messages")
	ErrPanic          = errors.New("queen: handler panicked")
	ErrKeyedSettle    = errors.New("queen: a message handled with KeyConcurrency > 1 fails by its handler's error, not by Fail, Retry or AckBatch")
	ErrAlreadyAcked   = errors.New("queen: already acked")
	ErrAckSkipped     = errors.New("queen: ack skipped after an earlier failure in the batch")
	ErrUnknownMessage = errors.New("queen: unknown message")
	ErrTxAborted      = errors.New("queen: transaction rolled back")
	ErrGroupActive    = errors.New("queen: the group holds a live lease")
	ErrNotFound       = errors.New("queen: not found")
)

// Errors the engine's parts pass between themselves; a caller sees them
// only wrapped, or not at all.
var (
	// ErrLeaseEnded is a Consume handler call's answer when the batch's lease
	// ended before the handler could start: the message was not handled
	// and is left to the partition's next holder.
	ErrLeaseEnded = errors.New("queen: the lease ended before the handler started")
	// ErrLanesChanged marks, in its result, an item the database sent back
	// because it was routed to a lane with a lane count that is not the
	// queue's: a client's cached settings can be a few seconds old, and a
	// key must never be stored in a lane other than the one the queue's
	// count gives. The push that owns the item routes it again; callers
	// never see it unless that keeps failing.
	ErrLanesChanged = errors.New("queen: the queue's lane count changed while routing")
	// ErrBehindSpool is why a push to a partition with spooled pushes not yet
	// replayed is spooled too: it must not overtake them.
	ErrBehindSpool = errors.New("queen: the partition has spooled pushes not yet replayed")
	// ErrMaintenance is why a push is spooled while maintenance mode is on.
	ErrMaintenance = errors.New("queen: maintenance mode is on")
)

// NoKey says that queue is encrypted and this client has no key.
func NoKey(queue string) error {
	return fmt.Errorf("%w: queue %q is encrypted and Config.EncryptionKey is not set", ErrEncryption, queue)
}
