package history

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Calls (OpCall kinds) that bound a proc's own maintenance window: the
// completion of its SetMaintenance(true) and the start of its
// SetMaintenance(false).
const (
	CallMaintenanceOn  = "maintenance-on"
	CallMaintenanceOff = "maintenance-off"
)

// maintenanceDirect: a push a client began after its own
// SetMaintenance(true) returned, and that ended before it began
// SetMaintenance(false), is Buffered (or Failed), never stored straight
// (Queued, Duplicate): the client must not read the mode as off unless
// someone turned it off. Another proc's "maintenance" fault, which turns
// the mode off at its end, excuses a push when the fault overlaps the time
// from that SetMaintenance's return to the push's end.
func (c *checker) maintenanceDirect(all []*Op) {
	type window struct {
		proc    string
		on, off int64
	}
	var wins []window
	var faults []*Op
	calls := map[string][]*Op{}
	for _, o := range all {
		switch {
		case o.Inv.Op == OpFault && o.Inv.Kind == "maintenance":
			faults = append(faults, o)
		case o.Inv.Op == OpCall && (o.Inv.Kind == CallMaintenanceOn || o.Inv.Kind == CallMaintenanceOff):
			calls[o.Inv.Proc] = append(calls[o.Inv.Proc], o)
		}
	}
	for p, cs := range calls {
		slices.SortStableFunc(cs, func(a, b *Op) int { return cmp.Compare(a.Start(), b.Start()) })
		for i, o := range cs {
			if o.Inv.Kind != CallMaintenanceOn || o.Phase() != OK {
				continue
			}
			w := window{p, o.End(), math.MaxInt64}
			for _, n := range cs[i+1:] {
				if n.Inv.Kind == CallMaintenanceOff {
					w.off = n.Start()
					break
				}
			}
			wins = append(wins, w)
		}
	}
	if len(wins) == 0 {
		return
	}
	for _, o := range all {
		if o.Inv.Op != OpPush || o.Phase() != OK {
			continue
		}
		for _, w := range wins {
			if o.Inv.Proc != w.proc || o.Start() < w.on || o.End() > w.off {
				continue
			}
			excused := slices.ContainsFunc(faults, func(f *Op) bool {
				return f.Inv.Proc != w.proc && f.Start() < o.End() && f.End() > w.on
			})
			if excused {
				continue
			}
			for i, r := range o.Done.Results {
				if r.Status != "queued" && r.Status != "duplicate" {
					continue
				}
				part := ""
				if i < len(o.Inv.Items) {
					part = o.Inv.Items[i].Partition
				}
				c.where = Violation{Queue: o.Inv.Queue, Partition: part}
				c.report("maintenance-direct", fmt.Sprintf("queue %s: item %d %s, pushed after this client's SetMaintenance(true) returned and before anyone turned maintenance mode off",
					o.Inv.Queue, i, r.Status), o.evidence()...)
				break
			}
		}
	}
}
