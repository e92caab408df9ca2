package queen

import (
	"time"

	"github.com/e03140bc/queen/internal/backoff"
)

// backoffJitter is backoff.Jitter: a wait drawn uniformly from [d/2, d].
func backoffJitter(d time.Duration) time.Duration { return backoff.Jitter(d) }
