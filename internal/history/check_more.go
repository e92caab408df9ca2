package history

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// faultMargin is how long a fault's effects may outlast its event: a pool
// finds its connections broken by a restart only when it next uses them.
const faultMargin = int64(5 * time.Second)

// Checks of the calls beyond push, pop and settle: requeued dead letters,
// deleted queues, paused groups, rejected input and foreign keys.

type qgi struct{ queue, group, id string }
type qpi struct{ queue, partition, id string }

// destroyedIDs: the messages of which some row was destroyed. A failed
// message's redelivery (a skip-policy copy) or a requeued dead letter's
// copy may be that row: its dead letter then holds nothing of the message
// (nil id), so neither its delivery nor its dead letter can be matched.
func (c *checker) destroyedIDs() map[qpi]bool {
	out := map[qpi]bool{}
	for _, d := range c.st.Destroyed {
		out[qpi{d.Queue, d.Partition, d.ID}] = true
	}
	return out
}

func (c *checker) isCall(o *Op, kind string) bool {
	return o.Inv.Op == OpCall && o.Inv.Kind == kind && !o.Inv.Invalid
}

// markCopies: RequeueDeadLetters appends a copy of a dead letter with its
// original's id and transaction id. Of the stored rows of one id in a
// partition of a queue the run requeued from, all but the oldest are such
// copies: not pushes of their own (Failures -1, like a skip re-enqueue).
// Rows marked already stay marked, so it may run again over a longer log.
// A dead letter a pop made of a destroyed message has none of its id or
// transaction id: every row of its (nil) id in that partition is a copy.
// One made before its segment was destroyed holds the message's id, and
// the oldest row of that id is the original as usual.
func (c *checker) markCopies(ops []*Op) {
	requeued := map[qt]bool{}
	orphans := map[qpi]bool{}
	for _, o := range ops {
		if c.isCall(o, "requeue") {
			for _, m := range o.Inv.Msgs {
				requeued[qt{o.Inv.Queue, m.ID}] = true
				if m.ID == zeroUUID && c.destroyed[qp{o.Inv.Queue, m.Partition}][m.Offset] {
					orphans[qpi{o.Inv.Queue, m.Partition, m.ID}] = true
				}
			}
			// Not to be requeued, but requeueUnbounded judges their copies
			// (they must not count as second pushes too).
			for _, m := range o.Inv.Kept {
				requeued[qt{o.Inv.Queue, m.ID}] = true
			}
		}
	}
	if len(requeued) == 0 {
		return
	}
	first := map[qpi]int{}
	for i, s := range c.st.Log {
		if s.Failures != 0 || !requeued[qt{s.Queue, s.ID}] {
			continue
		}
		k := qpi{s.Queue, s.Partition, s.ID}
		if orphans[k] && !c.destroyed[qp{s.Queue, s.Partition}][s.Offset] {
			c.st.Log[i].Failures = -1
			continue
		}
		j, ok := first[k]
		switch {
		case !ok:
			first[k] = i
		case c.st.Log[j].Offset < s.Offset:
			c.st.Log[i].Failures = -1
		default:
			c.st.Log[j].Failures = -1
			first[k] = i
		}
	}
}

// nilID is the message id of a destroyed message's dead letter.
const nilID = "00000000-0000-0000-0000-000000000000"

// requeueUnbounded: a RequeueDeadLetters call requeues none of the dead
// letters above its MaxID, even when given their ids: no copy of one is
// stored unless some call was asked to requeue it.
func (c *checker) requeueUnbounded(ops []*Op) {
	asked := map[qt]bool{}
	kept := map[qt]*Op{}
	for _, o := range ops {
		if !c.isCall(o, "requeue") {
			continue
		}
		for _, m := range o.Inv.Msgs {
			asked[qt{o.Inv.Queue, m.ID}] = true
		}
		for _, m := range o.Inv.Kept {
			if k := (qt{o.Inv.Queue, m.ID}); kept[k] == nil {
				kept[k] = o
			}
		}
	}
	for _, s := range c.st.Log {
		k := qt{s.Queue, s.ID}
		if o := kept[k]; o != nil && s.Failures == -1 && !asked[k] && s.ID != nilID {
			c.where = Violation{Queue: s.Queue, Group: o.Inv.Group, Partition: s.Partition}
			c.report("requeue-unbounded", fmt.Sprintf("queue %s group %q: id %s, a dead letter a requeue was not to take (above its MaxID, or not the one it named), was requeued (a copy at %s@%d)",
				s.Queue, o.Inv.Group, s.ID, s.Partition, s.Offset), o.evidence()...)
		}
	}
}

// deleteCuts: per queue, when its last Queue.Delete that may have
// happened took effect at the latest: before a message of the final log
// was first known to exist after it began (stored in the new queue, so
// after the delete committed), and for one that returned, by its return
// at the latest. One of unknown outcome may commit past its return, and
// did not happen at all if a message of the final log was known before it
// began (the final log would not hold it); one that never returned thus
// cuts at the new queue's first message.
func (c *checker) deleteCuts(ops []*Op) map[string]int64 {
	var seen map[string][]int64
	cut := map[string]int64{}
	for _, o := range ops {
		if !c.isCall(o, "delete") || o.Phase() == Fail {
			continue
		}
		if seen == nil {
			seen = c.known(ops)
		}
		after := int64(math.MaxInt64)
		survived := false
		for _, at := range seen[o.Inv.Queue] {
			if at < o.Start() {
				survived = true
				break
			}
			after = min(after, at)
		}
		// Strictly before: the op that first showed the message read the
		// new queue (its end may be that moment).
		if after < math.MaxInt64 {
			after--
		}
		t := o.End()
		switch {
		case o.Phase() == OK && !survived:
			// Committed before it returned, and before the new queue's
			// first message was created.
			t = min(t, after)
		case o.Phase() == OK:
			// A message known before it began survived it:
			// deletedSurvived's to judge; cut at its return.
		case survived:
			continue
		default:
			// Not capped by its return: a cancelled DELETE may still
			// commit after the client gave up.
			t = after
		}
		cut[o.Inv.Queue] = max(cut[o.Inv.Queue], t)
	}
	return cut
}

// known: per queue, when each message of the final log was first known to
// exist (a delivery of it, or a push that reported it stored).
func (c *checker) known(ops []*Op) map[string][]int64 {
	first := map[qt]int64{}
	note := func(q, id string, t int64) {
		if at, ok := first[qt{q, id}]; !ok || t < at {
			first[qt{q, id}] = t
		}
	}
	for _, o := range ops {
		t := o.End()
		if o.Inv.Op == OpHandler {
			t = o.Start()
		}
		for _, m := range delivered(o) {
			note(o.Inv.Queue, m.ID, t)
		}
		if o.Inv.Op == OpPush && o.Phase() == OK && !o.Inv.Rollback {
			for _, r := range o.Done.Results {
				if r.Status == "queued" || r.Status == "committed" {
					note(o.Inv.Queue, r.ID, t)
				}
			}
		}
	}
	seen := map[string][]int64{}
	for _, s := range c.st.Log {
		if t, ok := first[qt{s.Queue, s.ID}]; ok {
			seen[s.Queue] = append(seen[s.Queue], t)
		}
	}
	return seen
}

// deletedSurvived: a message whose every push was Queued (or committed)
// before a Queue.Delete of its queue began, and that was then deleted,
// is gone.
func (c *checker) deletedSurvived(ops []*Op) {
	var deletes []*Op
	for _, o := range ops {
		if c.isCall(o, "delete") && o.Phase() == OK {
			deletes = append(deletes, o)
		}
	}
	if len(deletes) == 0 {
		return
	}
	type fate struct {
		last   int64 // the end of its latest push
		stored bool  // a push reported it stored (not Buffered)
		open   bool  // a push of unknown outcome, or Buffered: may land later
		ev     []Event
	}
	fates := map[qt]*fate{}
	for _, o := range ops {
		if o.Inv.Op != OpPush || o.Inv.Rollback {
			continue
		}
		for i, it := range o.Inv.Items {
			k := qt{o.Inv.Queue, it.TxID}
			f := fates[k]
			if f == nil {
				f = &fate{}
				fates[k] = f
			}
			f.last = max(f.last, o.End())
			switch {
			case o.Phase() == OK && o.Done != nil && i < len(o.Done.Results):
				switch o.Done.Results[i].Status {
				case "queued", "committed":
					f.stored = true
					f.ev = append(f.ev, o.evidence()...)
				case "buffered":
					f.open = true
				}
			case o.Phase() == Info:
				f.open = true
			}
		}
	}
	for _, s := range c.st.Log {
		if s.Failures != 0 {
			continue
		}
		f := fates[qt{s.Queue, s.TxID}]
		if f == nil || f.open || !f.stored {
			continue
		}
		for _, d := range deletes {
			if d.Inv.Queue == s.Queue && d.Start() > f.last {
				c.where = Violation{Queue: s.Queue, Partition: s.Partition}
				c.report("deleted-survived", fmt.Sprintf("queue %s: transaction %q, stored before the queue was deleted, is still at %s@%d",
					s.Queue, s.TxID, s.Partition, s.Offset), append(clip(f.ev, 2), d.evidence()...)...)
				break
			}
		}
	}
}

// lastEpoch keeps, of a queue that was deleted, only what began after its
// last deletion ended: the rest read or wrote a queue that is gone. A push
// that began before stays, of unknown outcome (it may have stored into
// the new queue, a Buffered one later still). So does a pop that ended
// after (it may have waited into the new queue), with only the messages
// the new queue's log has at their place; and so does a Consume handler
// that began after: its batch may have been claimed before (a claim is
// logged only after it returned), so it may run a message of the deleted
// queue.
func (c *checker) lastEpoch(ops []*Op) []*Op {
	cut := c.deleteCuts(ops)
	if len(cut) == 0 {
		return ops
	}
	seen := c.known(ops)
	c.reborn = map[string]int64{}
	for q := range cut {
		c.reborn[q] = math.MaxInt64
		for _, at := range seen[q] {
			c.reborn[q] = min(c.reborn[q], at)
		}
	}
	log := c.index()
	inLog := func(queue string, ms []Delivery) []Delivery {
		var out []Delivery
		for _, m := range ms {
			if s, ok := log[qp{queue, m.Partition}][m.Offset]; ok && s.ID == m.ID {
				out = append(out, m)
			}
		}
		return out
	}
	out := ops[:0:0]
	for _, o := range ops {
		t, ok := cut[o.Inv.Queue]
		switch {
		case ok && o.Inv.Op == OpHandler && o.Start() > t:
			if inv := o.Inv; len(inLog(inv.Queue, inv.Msgs)) == len(inv.Msgs) {
				out = append(out, o)
			}
		case !ok || o.Start() > t:
			out = append(out, o)
		case o.Inv.Op == OpPop && o.End() > t:
			if o.Phase() != OK {
				out = append(out, o) // an auto-ack of unknown outcome may have taken from the new queue
				continue
			}
			done := *o.Done
			done.Msgs = inLog(o.Inv.Queue, o.Done.Msgs)
			out = append(out, &Op{Inv: o.Inv, Done: &done})
		case o.Inv.Op == OpPush && (o.Inv.Rollback || o.Phase() == Fail):
			out = append(out, o) // certainly stored nothing, in either queue
		case o.Inv.Op == OpPush:
			// Of unknown outcome in the last queue (deletedSurvived judged
			// the ones that ended before a deletion). An item reported
			// Buffered may be stored there twice (its flush committed
			// unseen, then its replay): it stays as two such pushes.
			out = append(out, &Op{Inv: o.Inv})
			if again := bufferedItems(o); len(again) > 0 {
				inv := o.Inv
				inv.Items = again
				out = append(out, &Op{Inv: inv})
			}
		}
	}
	return out
}

// bufferedItems are the items of a push it reported Buffered.
func bufferedItems(o *Op) []Item {
	if o.Phase() != OK {
		return nil
	}
	var out []Item
	for i, it := range o.Inv.Items {
		if i < len(o.Done.Results) && o.Done.Results[i].Status == "buffered" {
			out = append(out, it)
		}
	}
	return out
}

// redelivered: a message a group failed or retried (Fail, Retry, a
// handler's error or panic, Tx.Fail) is delivered to that group again or
// ends in its dead letters, on a queue that keeps them. A settlement that
// commits past it loses it.
func (c *checker) redelivered(ops []*Op) {
	dels := map[qgi][]*Op{}
	blind := map[string]int64{} // queue/group -> latest end of an unknown auto-ack pop
	for _, o := range ops {
		for _, m := range delivered(o) {
			k := qgi{o.Inv.Queue, o.Inv.Group, m.ID}
			dels[k] = append(dels[k], o)
		}
		if o.Inv.Op == OpPop && o.Inv.AutoAck && o.Phase() != OK {
			k := o.Inv.Queue + "\x00" + o.Inv.Group
			blind[k] = max(blind[k], o.End())
		}
	}
	dead := map[qgi]bool{}
	for _, d := range c.st.DeadLetters {
		dead[qgi{d.Queue, d.Group, d.ID}] = true
	}
	c.addDiscarded(dead, ops) // check_sched.go
	lostCopy := c.destroyedIDs()
	for _, o := range ops {
		qi, ok := c.st.Queues[o.Inv.Queue]
		if !ok || !qi.DeadLetter || qi.Retained {
			continue
		}
		var id, partition string
		var offset int64
		switch {
		case o.Inv.Op == OpSettle && (o.Inv.Kind == "fail" || o.Inv.Kind == "retry") && o.Phase() == OK:
			id, partition, offset = o.Inv.ID, o.Inv.Partition, o.Inv.Offset
		case o.Inv.Op == OpHandler && o.Inv.AutoAck:
			continue // consumed by its claim: a handler's error is only logged
		case o.Inv.Op == OpHandler && o.Done != nil && o.Done.Err != "" && len(o.Inv.Msgs) == 1:
			id, partition, offset = o.Inv.Msgs[0].ID, o.Inv.Msgs[0].Partition, o.Inv.Msgs[0].Offset
		default:
			continue
		}
		if c.destroyed[qp{o.Inv.Queue, partition}][offset] || lostCopy[qpi{o.Inv.Queue, partition, id}] ||
			blind[o.Inv.Queue+"\x00"+o.Inv.Group] > o.Start() {
			continue
		}
		k := qgi{o.Inv.Queue, o.Inv.Group, id}
		if dead[k] {
			continue
		}
		again := false
		for _, d := range dels[k] {
			if d != o && d.End() > o.Start() {
				again = true
				break
			}
		}
		if !again {
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: partition}
			c.report("failed-not-redelivered", fmt.Sprintf("queue %s group %q: %s@%d id %s was failed (%s) and never delivered again nor dead-lettered",
				o.Inv.Queue, o.Inv.Group, partition, offset, id, o.Inv.Op+" "+o.Inv.Kind), o.evidence()...)
		}
	}
}

// requeued: every dead letter a RequeueDeadLetters call was given is,
// at the end, still a dead letter or delivered again to its group.
func (c *checker) requeued(ops []*Op) {
	dels := map[qgi][]*Op{}
	for _, o := range ops {
		for _, m := range delivered(o) {
			k := qgi{o.Inv.Queue, o.Inv.Group, m.ID}
			dels[k] = append(dels[k], o)
		}
	}
	dead := map[qgi]bool{}
	for _, d := range c.st.DeadLetters {
		dead[qgi{d.Queue, d.Group, d.ID}] = true
	}
	c.addDiscarded(dead, ops) // check_sched.go
	lostCopy := c.destroyedIDs()
	for _, o := range ops {
		qi, ok := c.st.Queues[o.Inv.Queue]
		if !ok || qi.Retained || !c.isCall(o, "requeue") || o.Phase() != OK {
			continue
		}
		for _, m := range o.Inv.Msgs {
			if c.destroyed[qp{o.Inv.Queue, m.Partition}][m.Offset] || lostCopy[qpi{o.Inv.Queue, m.Partition, m.ID}] {
				continue
			}
			k := qgi{o.Inv.Queue, o.Inv.Group, m.ID}
			if dead[k] {
				continue
			}
			again := false
			for _, d := range dels[k] {
				if d.End() > o.Start() {
					again = true
					break
				}
			}
			if !again {
				c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: m.Partition}
				c.report("requeue-lost", fmt.Sprintf("queue %s group %q: dead letter %s@%d id %s was requeued, is no dead letter at the end and was never delivered again",
					o.Inv.Queue, o.Inv.Group, m.Partition, m.Offset, m.ID), o.evidence()...)
			}
		}
	}
}

// paused: a pop that began after a Pause of its group returned, and ended
// before any Resume of it could have begun, delivers nothing.
func (c *checker) paused(ops []*Op) {
	type qg struct{ queue, group string }
	pauses := map[qg][]*Op{}
	resumes := map[qg][]*Op{}
	for _, o := range ops {
		switch {
		case c.isCall(o, "pause") && o.Phase() == OK:
			k := qg{o.Inv.Queue, o.Inv.Group}
			pauses[k] = append(pauses[k], o)
		case c.isCall(o, "resume"):
			k := qg{o.Inv.Queue, o.Inv.Group}
			resumes[k] = append(resumes[k], o)
		}
	}
	for _, o := range ops {
		if o.Inv.Op != OpPop || o.Phase() != OK || len(o.Done.Msgs) == 0 {
			continue
		}
		k := qg{o.Inv.Queue, o.Inv.Group}
		for _, p := range pauses[k] {
			if p.End() >= o.Start() {
				continue
			}
			resumed := false
			for _, r := range resumes[k] {
				if r.Start() < o.End() && r.End() > p.Start() {
					resumed = true
					break
				}
			}
			if !resumed {
				c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group}
				c.report("paused-delivered", fmt.Sprintf("queue %s group %q: a pop delivered %d messages while the group was paused",
					o.Inv.Queue, o.Inv.Group, len(o.Done.Msgs)), append(p.evidence(), o.evidence()...)...)
				break
			}
		}
	}
}

// rejected: a call given invalid input fails with the error for it and
// writes nothing (its pushes' items are checked as failed by pushes); a
// Consume returns once its context ends; the database never rejects the
// text of a settlement (a reason it cannot hold is the library's to clean).
func (c *checker) rejected(ops []*Op) {
	for _, o := range ops {
		switch {
		// A call without a completion was cut short by its process's
		// death (a killed child): how it would have ended is unknown.
		case o.Inv.Invalid && o.Done != nil && o.Phase() != Fail && !panicked(o): // a panic is misuse's to report
			res := "succeeded"
			if o.Done.Err != "" {
				res = "failed with " + fmt.Sprintf("%q", o.Done.Err)
			}
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group}
			c.report("invalid-accepted", fmt.Sprintf("queue %q: %s %s given invalid input %s, not with its validation error", o.Inv.Queue, o.Inv.Op, o.Inv.Kind, res), o.evidence()...)
		case o.Done != nil && strings.HasPrefix(o.Done.Err, "stuck:"):
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group}
			c.report("stuck", fmt.Sprintf("queue %s: %s %s %s", o.Inv.Queue, o.Inv.Op, o.Inv.Kind, o.Done.Err), o.evidence()...)
		case c.isCall(o, "settle-log") && o.Done != nil && textRejected(o.Done.Err):
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: o.Inv.Partition}
			c.report("settle-rejected", fmt.Sprintf("queue %s: the database rejected a settlement's text: %s", o.Inv.Queue, o.Done.Err), o.evidence()...)
		}
	}
}

func textRejected(err string) bool {
	for _, s := range []string{"SQLSTATE 22021", "SQLSTATE 22P05", "invalid byte sequence", "unsupported Unicode escape"} {
		if strings.Contains(err, s) {
			return true
		}
	}
	return false
}

// wrongKey: a client without a queue's keys is delivered nothing of it, and
// nothing of an encrypted queue is dead-lettered for want of a key (every
// other consumer of the run holds them all).
func (c *checker) wrongKey(ops []*Op) {
	for _, o := range ops {
		if !o.Inv.WrongKey || !c.st.Queues[o.Inv.Queue].Encrypted {
			continue
		}
		if ms := delivered(o); len(ms) > 0 {
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: ms[0].Partition}
			c.report("wrong-key-consumed", fmt.Sprintf("queue %s group %q: a client without the queue's key was delivered %s@%d",
				o.Inv.Queue, o.Inv.Group, ms[0].Partition, ms[0].Offset), o.evidence()...)
		}
	}
	for _, d := range c.st.DeadLetters {
		r := strings.ToLower(d.Reason)
		if c.st.Queues[d.Queue].Encrypted && (strings.Contains(r, "encrypt") || strings.Contains(r, "decrypt")) &&
			!strings.HasPrefix(r, "history") {
			c.where = Violation{Queue: d.Queue, Group: d.Group, Partition: d.Partition}
			c.report("wrong-key-dead-letter", fmt.Sprintf("queue %s group %q: %s@%d id %s was dead-lettered for a key: %q",
				d.Queue, d.Group, d.Partition, d.Offset, d.ID, d.Reason))
		}
	}
}

// rawErrors: no call fails with a PostgreSQL error no call documents: an
// integrity violation (SQLSTATE class 23; a push racing Queue.Delete gets
// QN001, never a foreign-key error) or a push's deadlock (40P01; PushTx
// calls of one transaction to the same partitions in different orders may
// deadlock, which the run never makes, and a first keyed push whose client
// logged that it could not mark the queue keyed ahead marks it itself).
func (c *checker) rawErrors(ops []*Op) {
	var marks []*Op
	for _, o := range ops {
		if c.isCall(o, "mark-failed") {
			marks = append(marks, o)
		}
	}
	for _, o := range ops {
		if o.Done == nil || o.Done.Err == "" && o.Done.ItemErr == "" {
			continue
		}
		err := o.Done.Err
		if err == "" {
			err = o.Done.ItemErr
		}
		switch {
		case strings.Contains(err, "(SQLSTATE 23"):
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: o.Inv.Partition}
			c.report("raw-error", fmt.Sprintf("queue %s: %s %s failed with an integrity violation: %s", o.Inv.Queue, o.Inv.Op, o.Inv.Kind, err), o.evidence()...)
		case o.Inv.Op == OpPush && strings.Contains(err, "(SQLSTATE 40P01)"):
			excused := false
			for _, m := range marks {
				if m.Inv.Proc == o.Inv.Proc && m.Start() >= o.Start() && m.Start() <= o.End() {
					excused = true
					break
				}
			}
			if !excused {
				c.where = Violation{Queue: o.Inv.Queue}
				c.report("deadlock", fmt.Sprintf("queue %s: %s %s deadlocked: %s", o.Inv.Queue, o.Inv.Op, o.Inv.Kind, err), o.evidence()...)
			}
		}
	}
}

// orphans: a queue or partition that is deleted leaves none of its rows
// behind (a Queue.Delete racing pushes must not let them add rows to the
// partitions it deletes).
func (c *checker) orphans() {
	for _, o := range c.st.Orphans {
		c.where = Violation{}
		c.report("orphan-rows", fmt.Sprintf("%d rows of %s belong to partition id %d, which no longer exists", o.Rows, o.Table, o.Partition))
	}
}

// payloads: every delivery carries the payload its message was pushed with
// (a handler writing to an earlier delivery's Data changes no stored copy:
// a dead letter, a FailureSkip re-enqueue).
func (c *checker) payloads(ops []*Op) {
	for _, o := range ops {
		bad := o.Inv.BadData
		if o.Done != nil {
			bad = append(bad, o.Done.BadData...)
		}
		for _, m := range bad {
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: m.Partition}
			c.report("corrupt-payload", fmt.Sprintf("queue %s group %q: %s@%d id %s (transaction %q) was delivered with a payload other than the one pushed",
				o.Inv.Queue, o.Inv.Group, m.Partition, m.Offset, m.ID, m.TxID), o.evidence()...)
		}
	}
}

// statusLag: a group's Lag in a Queue.Status read is the retained messages
// after its cursor, less the offsets settled above it (those are skipped):
// exactly that when the cursor is at or past the oldest retained offset;
// with retention past the cursor, at most the retained count and less by
// at most Settled (settled offsets below the cut may linger until a pop).
func (c *checker) statusLag(ops []*Op) {
	for _, o := range ops {
		l := o.Inv.Lag
		if !c.isCall(o, "status") || l == nil {
			continue
		}
		base := max(l.LastOffset-max(l.Committed, l.LogStart-1), 0)
		lo, hi := base-int64(l.Settled), base
		if l.Committed >= l.LogStart-1 {
			hi = lo
		}
		if l.Lag < max(lo, 0) || l.Lag > hi {
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: o.Inv.Partition}
			c.report("status-lag", fmt.Sprintf("queue %s group %q partition %s: Status read lag %d with last offset %d, log start %d, committed %d, %d settled (want %d..%d)",
				o.Inv.Queue, o.Inv.Group, o.Inv.Partition, l.Lag, l.LastOffset, l.LogStart, l.Committed, l.Settled, max(lo, 0), hi), o.evidence()...)
		}
	}
}

// autoAckConsumes reads the Consume calls with AutoAck ("consume" calls
// with AutoAck, recorded from start to return) and their claims (OpClaim
// without a lease, from the client's log). A call is uncertain if it never
// returned, a fault came near it, or a claim of its client on its queue
// failed while it ran: a claim may then have committed (consumed its batch)
// with nobody seeing it, which at-most-once allows. For those it returns
// the earliest start per queue/group; for the others, each logged claim as
// a commit through its last offset that may have applied from the call's
// start on.
func (c *checker) autoAckConsumes(ops []*Op) (uncertain map[string]int64, claims map[qgp][]autoClaim) {
	uncertain = map[string]int64{}
	claims = map[qgp][]autoClaim{}
	var calls, faults, errs, logged []*Op
	for _, o := range ops {
		switch {
		case c.isCall(o, "consume") && o.Inv.AutoAck:
			calls = append(calls, o)
		case o.Inv.Op == OpFault:
			faults = append(faults, o)
		case c.isCall(o, "claim-error"):
			errs = append(errs, o)
		case o.Inv.Op == OpClaim && o.Inv.Lease == "":
			logged = append(logged, o)
		}
	}
	for _, o := range calls {
		sure := o.Done != nil
		for _, f := range faults {
			if sure && f.Start() < o.End() && f.End() > o.Start()-faultMargin {
				sure = false
			}
		}
		for _, e := range errs {
			if sure && e.Inv.Proc == o.Inv.Proc && e.Inv.Queue == o.Inv.Queue && e.Start() >= o.Start() && e.Start() <= o.End() {
				sure = false
			}
		}
		k := o.Inv.Queue + "\x00" + o.Inv.Group
		if !sure {
			if t, ok := uncertain[k]; !ok || o.Start() < t {
				uncertain[k] = o.Start()
			}
			continue
		}
		for _, l := range logged {
			if l.Inv.Proc == o.Inv.Proc && l.Inv.Queue == o.Inv.Queue && l.Inv.Group == o.Inv.Group && l.Start() >= o.Start() && l.Start() <= o.End() {
				qk := qgp{l.Inv.Queue, l.Inv.Group, l.Inv.Partition}
				claims[qk] = append(claims[qk], autoClaim{start: o.Start(), last: l.Inv.Last})
			}
		}
	}
	return uncertain, claims
}

type autoClaim struct{ start, last int64 }
