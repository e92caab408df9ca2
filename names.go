package queen

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/e03140bc/queen/internal/frame"
)

// nameKind is what a name names; it picks checkName's rules.
type nameKind uint8

const (
	nameQueue         nameKind = iota
	namePartition              // "" is the default partition (or any)
	nameGroup                  // "" is queue mode
	nameKey                    // "" is none
	nameTransactionID          // "" mints one
	nameHeader                 // an Item.Headers name
	// nameStoredPartition is a partition as stored (the spool's): never "".
	nameStoredPartition
)

func (k nameKind) String() string {
	switch k {
	case nameQueue:
		return "queue"
	case namePartition, nameStoredPartition:
		return "partition"
	case nameGroup:
		return "group"
	case nameKey:
		return "key"
	case nameTransactionID:
		return "transaction id"
	case nameHeader:
		return "header name"
	}
	return "name"
}

// checkName is the one check of every name a public call takes, run before
// anything reaches the database: a name PostgreSQL text cannot hold would
// fail there with a raw encoding error, and a too long one would match
// nothing. Queue, partition and group names are 1 to MaxNameLen bytes of
// UTF-8 without control characters; keys are at most MaxKeyLen bytes and
// transaction ids at most MaxTransactionIDLen (else ErrTooLarge), both
// UTF-8 without NUL, since settling a message sends them back as text.
// It returns nil or an error wrapping ErrInvalidName (or ErrTooLarge).
func checkName(k nameKind, s string) error {
	var ok bool
	switch k {
	case nameQueue, nameStoredPartition:
		ok = validName(s)
	case namePartition, nameGroup:
		ok = s == "" || validName(s)
	case nameKey:
		ok = len(s) <= MaxKeyLen && textOK(s)
	case nameTransactionID:
		if len(s) > MaxTransactionIDLen {
			return fmt.Errorf("%w: transaction id of %d bytes (max %d)", ErrTooLarge, len(s), MaxTransactionIDLen)
		}
		ok = textOK(s)
	case nameHeader:
		ok = s != "" && frame.ValidHeaderText(s)
	}
	if ok {
		return nil
	}
	return fmt.Errorf("%w: %s %q", ErrInvalidName, k, s)
}

// validName reports whether s can name a queue, a partition or a group.
func validName(s string) bool {
	if s == "" || len(s) > MaxNameLen || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}

// textOK reports whether PostgreSQL text can hold s.
func textOK(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// checkFilters checks the names a DeadLetterQuery filters on.
func (o DeadLetterQuery) checkFilters() error {
	if err := checkName(namePartition, o.Partition); err != nil {
		return err
	}
	for _, g := range o.Groups {
		if err := checkName(nameGroup, g); err != nil {
			return err
		}
	}
	return nil
}
