package history

import "fmt"

// Bound is one measure of a call against the bound the design states for
// it (the bounds scenarios of the history test: a cost or a result that no
// history of a small queue shows).
type Bound struct {
	Kind         string // the violation's kind when Got is over Max
	Queue, Group string
	What         string // what was measured, for the report
	Got, Max     int64
}

func (b Bound) String() string {
	return fmt.Sprintf("%s: queue %s group %q: %s: %d (bound %d)", b.Kind, b.Queue, b.Group, b.What, b.Got, b.Max)
}

// CheckBounds reports every measure over its bound.
func CheckBounds(bs []Bound) []Violation {
	var vs []Violation
	for _, b := range bs {
		if b.Got > b.Max {
			vs = append(vs, Violation{Kind: b.Kind, Queue: b.Queue, Group: b.Group,
				Detail: fmt.Sprintf("queue %s group %q: %s: %d, over the design's bound %d", b.Queue, b.Group, b.What, b.Got, b.Max)})
		}
	}
	return vs
}
