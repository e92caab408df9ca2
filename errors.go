package queen

import (
	"github.com/e03140bc/queen/internal/errs"
	"github.com/e03140bc/queen/sqlschema"
)

// Sentinel errors, matched with errors.Is. Errors from PostgreSQL stay
// reachable with errors.As(err, &pgErr) where pgErr is *pgconn.PgError.
// SQLSTATE QN001 is queen's own: a push whose queue or partition was
// deleted (Queue.Delete) while it ran; it wrote nothing and can be retried.
var (
	// ErrClosed is returned by every call on a client after Close began.
	ErrClosed = errs.ErrClosed
	// ErrInvalidName is returned for an empty, over-long or control-character
	// queue, partition or group name (in any call or filter, such as
	// PopOptions or DeadLetterQuery), a key, transaction id or header that
	// is not valid UTF-8 or holds a NUL byte, an over-long key, or an
	// invalid Config.Schema. Nothing reaches the database then.
	ErrInvalidName = errs.ErrInvalidName
	// ErrLeaseLost means the message's lease expired (or was taken over) and
	// the message may be redelivered to another consumer.
	ErrLeaseLost = errs.ErrLeaseLost
	// ErrSchemaTooNew means the database was migrated by a newer release.
	ErrSchemaTooNew = sqlschema.ErrSchemaTooNew
	// ErrNoCitus is returned by Open with Config.Citus on a database
	// without the citus extension.
	ErrNoCitus = sqlschema.ErrNoCitus
	// ErrTooLarge is returned for a transaction id or payload over its limit
	// (MaxTransactionIDLen, MaxPayloadSize), or an Item.DeliverAt more than
	// MaxDeliverAhead ahead.
	ErrTooLarge = errs.ErrTooLarge
	// ErrEncryption is returned when a queue has encryption on and the client
	// has no valid 32-byte Config.EncryptionKey, or a payload fails to
	// decrypt: its key is neither Config.EncryptionKey nor among
	// Config.DecryptionKeys, or the ciphertext was altered or does not
	// belong to this message (it is bound to its tenant, queue, partition,
	// ordering key and message id).
	// Queen never writes plaintext to an encrypted queue.
	ErrEncryption = errs.ErrEncryption
	// ErrLanesFixed is returned by Configure for a QueueOptions.Lanes other
	// than the queue's once the queue has stored a message with a Key:
	// another lane count would move keys to other lanes and break their
	// order. Nothing is changed.
	ErrLanesFixed = errs.ErrLanesFixed
	// ErrPanic is wrapped by the error Consume fails a message with when its
	// handler panicked; the message's retry budget is charged as for any
	// handler error.
	ErrPanic = errs.ErrPanic
	// ErrKeyedSettle is returned by Fail and Retry, and by AckBatch per
	// message, for a message handed to a Consume handler with
	// KeyConcurrency > 1: such a message fails by its handler's returned
	// error (Ack and DeadLetter settle it alone). A cumulative settlement
	// would commit past other keys' messages still running.
	ErrKeyedSettle = errs.ErrKeyedSettle
	// ErrAlreadyAcked reports an ack (or Fail, Retry, DeadLetter) of a
	// message the cursor has already passed: acked by this or another
	// consumer, dead-lettered, or auto-acked. Nothing changed; treat it as
	// success when acking twice is harmless.
	ErrAlreadyAcked = errs.ErrAlreadyAcked
	// ErrAckSkipped is AckBatch's verdict for a request behind an earlier
	// failure, retry or dead letter of the same lease: the cursor stopped
	// below it and it will be redelivered.
	ErrAckSkipped = errs.ErrAckSkipped
	// ErrUnknownMessage means the message's partition or group no longer
	// exists (the queue was deleted) or the message never came from Pop.
	ErrUnknownMessage = errs.ErrUnknownMessage
	// ErrTxAborted wraps the reason Client.Tx rolled back: a duplicate push, or
	// an ack that could not apply (already acked, lease lost, unknown message).
	ErrTxAborted = errs.ErrTxAborted
	// ErrGroupActive is returned by ResetGroup and DeleteGroup while the
	// group holds a live (unexpired) lease on the queue or has a live
	// member (a running Consume, a Pop with PopOptions.Member), unless
	// their Force option is set. Nothing is changed.
	ErrGroupActive = errs.ErrGroupActive
	// ErrNotFound is returned by the operator calls ResetGroup,
	// DeleteGroup and ReleaseLease for a queue, partition or group that
	// does not exist. Nothing is changed.
	ErrNotFound = errs.ErrNotFound
)

// The engine's internal errors (see package errs).
var (
	errLeaseEnded   = errs.ErrLeaseEnded
	errLanesChanged = errs.ErrLanesChanged
	errBehindSpool  = errs.ErrBehindSpool
	errMaintenance  = errs.ErrMaintenance
)

// errNoKey says that queue is encrypted and this client has no key.
func errNoKey(queue string) error { return errs.NoKey(queue) }
