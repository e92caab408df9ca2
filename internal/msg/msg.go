// Package msg holds the data types queen's engine passes between its parts:
// where a consumer group starts. It imports
// nothing of queen's; the root re-exports the public ones under their
// documented names (queen.PopOptions is msg.PopOptions). The message as
// stored is frame.Frame (package internal/frame).
package msg

import "time"

// Subscription is where a consumer group starts reading a queue on its first
// contact. It is stored durably per (queue, group), so partitions created
// later are seeded by the same choice, and it is ignored on every later pop.
// The zero value is SubscribeAll. Queue mode (Group "") always starts at the
// oldest retained message.
type Subscription struct {
	mode string // "" means "all"
	from time.Time
}

var (
	// SubscribeAll starts a new consumer group at the oldest retained
	// message of every partition.
	SubscribeAll = Subscription{mode: "all"}
	// SubscribeNew starts a new consumer group after the current tail of
	// every existing partition. Partitions created after the group's first
	// contact are read from their start.
	SubscribeNew = Subscription{mode: "new"}
)

// SubscribeFrom starts a new consumer group at the first message pushed at
// or after t (at segment granularity: messages committed together share a
// timestamp). Partitions created after the group's first contact are read
// from their start.
func SubscribeFrom(t time.Time) Subscription { return Subscription{mode: "from", from: t} }

// SQLMode is the subscription as seed_consumers takes it: "all", "new" or
// "from" with its time.
func (s Subscription) SQLMode() (string, *time.Time) {
	switch s.mode {
	case "new":
		return "new", nil
	case "from":
		t := s.from
		return "from", &t
	default:
		return "all", nil
	}
}
