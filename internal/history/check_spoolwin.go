package history

import (
	"fmt"
	"slices"
)

// partitionsOwed: a transaction id pushed to several partitions of a
// deduped queue (one call's items whose keys share a lane under a stale
// lane count and part under the queue's: a layer-1 leader and follower) is
// stored in each partition a push reported it Buffered or committed in.
// One stored nowhere is "lost" already (see pushes); Queued results name
// their offset (wrong-result).
func (c *checker) partitionsOwed(ops []*Op) {
	named := map[qt]map[string]bool{}
	for _, o := range ops {
		if o.Inv.Op != OpPush || o.Inv.Rollback || !c.audited(o.Inv.Queue) {
			continue
		}
		for _, it := range o.Inv.Items {
			k := qt{o.Inv.Queue, it.TxID}
			if named[k] == nil {
				named[k] = map[string]bool{}
			}
			named[k][it.Partition] = true
		}
	}
	in := map[qt]map[string]bool{}
	for _, s := range c.st.Log {
		if s.Failures != 0 {
			continue
		}
		k := qt{s.Queue, s.TxID}
		if in[k] == nil {
			in[k] = map[string]bool{}
		}
		in[k][s.Partition] = true
	}
	for _, o := range ops {
		if o.Inv.Op != OpPush || o.Inv.Rollback || o.Phase() != OK || o.Done == nil || !c.audited(o.Inv.Queue) {
			continue
		}
		qi := c.st.Queues[o.Inv.Queue]
		if !qi.Deduped || qi.Retained || qi.Completed {
			continue
		}
		for i, it := range o.Inv.Items {
			if i >= len(o.Done.Results) {
				break
			}
			if st := o.Done.Results[i].Status; st != "buffered" && st != "committed" {
				continue
			}
			k := qt{o.Inv.Queue, it.TxID}
			if len(named[k]) < 2 || len(in[k]) == 0 || in[k][it.Partition] {
				continue
			}
			c.report("lost", fmt.Sprintf("queue %s: transaction %q reported %s in %s is not stored there (it is in %v)",
				k.queue, k.tx, o.Done.Results[i].Status, it.Partition, keysOf(in[k])), o.evidence()...)
		}
	}
}

func keysOf(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
