package history

import (
	"fmt"
	"strings"
	"time"
)

// PanicPrefix starts the error text recorded for a call that panicked.
const PanicPrefix = "panic: "

// lateMargin is how long after its deadline a call may return: a busy
// scheduler's delay, never the wait for work the deadline was to cut short.
const lateMargin = int64(10 * time.Second)

// secretPiece is the shortest run of a password's bytes that counts as
// shown: long enough that an error's own words never match one by chance.
const secretPiece = 5

func panicked(o *Op) bool { return o.Done != nil && strings.HasPrefix(o.Done.Err, PanicPrefix) }

// misuse: the contracts of calls made the way a careless user makes them.
// No public call panics (a nil or zero input gets an error); no error shows
// a piece of a password the call was given; no call returns more than
// lateMargin after the deadline it promised; and no call given valid input
// fails with a data exception (SQLSTATE class 22): the library sent
// PostgreSQL a value it cannot take, as a NOTIFY channel over the 63-byte
// identifier limit.
func (c *checker) misuse(ops []*Op) {
	for _, o := range ops {
		c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group}
		switch {
		case panicked(o):
			c.report("panic", fmt.Sprintf("%s %s panicked instead of returning an error: %s", o.Inv.Op, o.Inv.Kind, o.Done.Err), o.evidence()...)
		case o.Inv.Secret != "" && o.Done != nil && showsSecret(o.Done.Err, o.Inv.Secret):
			c.report("secret-leak", fmt.Sprintf("%s %s: its error shows part of the password it was given: %s", o.Inv.Op, o.Inv.Kind, o.Done.Err), o.evidence()...)
		// A call without a completion was cut short by its process's death;
		// the generators record a hung call as such.
		case o.Inv.Deadline != 0 && o.Done != nil && o.End()-o.Inv.Deadline > lateMargin:
			took := fmt.Sprintf("returned %s after its deadline (%s in all)", time.Duration(o.End()-o.Inv.Deadline).Round(time.Millisecond),
				time.Duration(o.End()-o.Start()).Round(time.Millisecond))
			c.report(o.Inv.Kind+"-late", fmt.Sprintf("%s %s promised to return within %s and %s", o.Inv.Op, o.Inv.Kind,
				time.Duration(o.Inv.Deadline-o.Start()).Round(time.Millisecond), took), o.evidence()...)
		case !o.Inv.Invalid && o.Inv.Op != OpHandler && strings.Contains(failure(o), "(SQLSTATE 22"):
			c.where.Partition = o.Inv.Partition
			c.report("data-exception", fmt.Sprintf("queue %s: %s %s given valid input failed with a data exception: %s", o.Inv.Queue, o.Inv.Op, o.Inv.Kind, failure(o)), o.evidence()...)
		}
	}
	c.where = Violation{}
}

// failure is the error a call failed with: its own, or a push's first
// failed item's. An ok call's Err is not a failure (a handler's, a logged
// settle failure's).
func failure(o *Op) string {
	switch {
	case o.Done == nil:
		return ""
	case o.Phase() != OK:
		return o.Done.Err
	}
	return o.Done.ItemErr
}

// showsSecret reports whether text holds secretPiece consecutive bytes of
// secret (all of it, if shorter).
func showsSecret(text, secret string) bool {
	n := min(secretPiece, len(secret))
	for i := 0; i+n <= len(secret); i++ {
		if strings.Contains(text, secret[i:i+n]) {
			return true
		}
	}
	return false
}
