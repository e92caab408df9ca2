package queen

import (
	"errors"
	"fmt"
	"time"
)

// RetryBackoff is how long a failed message waits before its next attempt,
// under FailurePolicy pause without KeyConcurrency and under FailurePolicy
// skip (see QueueOptions.RetryBackoff). After the n-th charged failure of a message
// (n = 1, 2, …: the failures RetryLimit counts, so lease expiries and
// Retry are not among them) the next attempt is not before
//
//	now + uniform[Min, min(Max, Min·2^n)]
//
// drawn in whole milliseconds by the database at the settlement that
// charges the failure: at least Min, at most Max, the upper end doubling
// with each failure. So with the defaults the first retry comes 1-2 s
// after the failure, the second 1-4 s, the third 1-8 s, and from the ninth
// on anywhere in 1 s-5 min. The jitter spreads the retries of messages
// that failed together (a downstream restart fails every partition at
// once) instead of retrying them in lockstep.
//
// Under pause the partition's cursor for that group records the time
// (GroupStatus.RetryAt) and holds no lease: no worker and no connection
// wait for it, the group's other partitions flow, and a consumer crash
// during the wait neither loses the message nor shortens the wait. Under
// skip the cursor passes the message at once and its copy waits in the
// database beside the partition (QueueStatus.RetriesWaiting) until it is
// appended at the tail, likewise surviving crashes and restarts.
type RetryBackoff struct {
	// Disabled redelivers a failed message at once, as before retry
	// backoff existed (Min and Max are then ignored). A handler's
	// RetryAfter is still honoured. Defaults to false.
	Disabled bool
	// Max caps the wait. Stored in whole milliseconds. Defaults to
	// DefaultRetryBackoffMax, or Min when Min is larger.
	Max time.Duration
	// Min is the shortest wait, and the base the upper end doubles from.
	// Stored in whole milliseconds: under 1ms is an error. Defaults to
	// DefaultRetryBackoffMin.
	Min time.Duration
}

const (
	// MaxRetryAfter caps the wait a handler asks for with RetryAfter or
	// Message.RetryAfter. Under FailurePause a waiting message pauses its
	// partition: a longer wait is an outage, better handled by Queue.Pause.
	MaxRetryAfter = time.Hour
)

func (b RetryBackoff) withDefaults() (RetryBackoff, error) {
	if b.Min < 0 {
		return b, fmt.Errorf("queen: QueueOptions.RetryBackoff.Min must not be negative (got %s)", b.Min)
	}
	if b.Max < 0 {
		return b, fmt.Errorf("queen: QueueOptions.RetryBackoff.Max must not be negative (got %s)", b.Max)
	}
	if b.Disabled {
		return RetryBackoff{Disabled: true}, nil
	}
	if b.Min == 0 {
		b.Min = DefaultRetryBackoffMin
	}
	if b.Min < time.Millisecond {
		return b, fmt.Errorf("queen: QueueOptions.RetryBackoff.Min %s is under the 1ms minimum", b.Min)
	}
	if b.Max == 0 {
		b.Max = max(DefaultRetryBackoffMax, b.Min)
	}
	if b.Min > b.Max {
		return b, fmt.Errorf("queen: QueueOptions.RetryBackoff.Min %s is over RetryBackoff.Max %s", b.Min, b.Max)
	}
	return b, nil
}

// retryBackoffOf is the RetryBackoff stored as minMs and maxMs: 0 and 0 is
// Disabled.
func retryBackoffOf(minMs, maxMs int64) RetryBackoff {
	if minMs <= 0 {
		return RetryBackoff{Disabled: true}
	}
	return RetryBackoff{Min: time.Duration(minMs) * time.Millisecond, Max: time.Duration(maxMs) * time.Millisecond}
}

// RetryAfter wraps err so that the failure it reports waits d before the
// message's next attempt, instead of the queue's RetryBackoff schedule: a
// Consume handler returns it (a 429's Retry-After), Message.Fail,
// Tx.Fail and AckBatch (AckFail) take it as their reason. The failure is
// charged as any other. d is rounded up to whole milliseconds and capped
// at MaxRetryAfter; d <= 0 keeps the queue's schedule. It applies where
// the schedule does (FailurePolicy pause with KeyConcurrency 1, and
// FailurePolicy skip), also when the queue's RetryBackoff is Disabled. The error's text is err's (or
// says the delay when err is nil), and errors.Is and errors.As see err.
func RetryAfter(d time.Duration, err error) error {
	return &retryAfterError{d: d, err: err}
}

type retryAfterError struct {
	d   time.Duration
	err error
}

func (e *retryAfterError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("queen: retry after %s", e.d)
	}
	return e.err.Error()
}

func (e *retryAfterError) Unwrap() error { return e.err }

// retryDelay is the wait a failure's reason asks for (see RetryAfter): 0
// for the queue's schedule, else at least 1ms and at most MaxRetryAfter.
func retryDelay(reason error) time.Duration {
	var ra *retryAfterError
	if !errors.As(reason, &ra) || ra.d <= 0 {
		return 0
	}
	return clampRetryAfter(ra.d)
}

func clampRetryAfter(d time.Duration) time.Duration {
	switch {
	case d <= 0:
		return 0
	case d > MaxRetryAfter:
		return MaxRetryAfter
	}
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}
