package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/e03140bc/queen"
)

var cmdGroup = &command{
	name:     "group",
	synopsis: "list|reset|delete <queue> [--group NAME] [--to earliest|latest|TIME] [--offset P=N]... [--partition P]... [--force]",
	short:    "list a queue's consumer groups, move a group's offsets, or delete a group",
	long: `list shows each consumer group of the queue: its lag (settled offsets not
counted), the age of its oldest unconsumed message, its live members (every
running Consume; a Pop that names itself) and its state: paused, abandoned
(lag and no live member) or running.

reset moves the group's cursors (--group, default "": queue mode) on every
partition of the queue, or on those --partition names, so that its next
delivery is:
  --to earliest   the oldest retained message (the group reads everything again)
  --to latest     nothing now stored: only what is pushed from now on
  --to TIME       the first message stored at or after TIME (RFC 3339, or a
                  duration meaning that long ago, e.g. 1h)
  --offset P=N    offset N of partition P exactly (repeatable, instead of --to;
                  clamped to what is retained: past the newest message is latest)
A moved cursor also forgets its retry waits, failure counts and what was
settled out of order above it. A group not yet subscribed is subscribed. It
prints each partition's committed offset before and after (the next delivery
is after + 1).

delete removes the group: its cursors, subscription and pause; completed
retention no longer waits for it. A consumer of the group still running
re-creates it as a new group on its next claim: stop them first.

Both refuse while the group is active (a live lease on the queue, or a live
member): stop its consumers, or pass --force, which ends those
leases (their holders' acks are refused and the messages are delivered again,
uncharged). Each is one transaction.`,
	flags: func(fs *flag.FlagSet, o *opts) {
		fs.StringVar(&o.group, "group", "", "the consumer `group` (default \"\": queue mode)")
		fs.StringVar(&o.resetTo, "to", "", "reset: `earliest`, latest, or a time (RFC 3339, or a duration ago)")
		fs.Func("offset", "reset: the next offset of a partition, `P=N` (repeatable)", func(s string) error {
			o.offsets = append(o.offsets, s)
			return nil
		})
		fs.Func("partition", "reset: only this `partition` (repeatable)", func(s string) error {
			o.partitions = append(o.partitions, s)
			return nil
		})
		fs.BoolVar(&o.force, "force", false, "end the group's live leases instead of refusing")
	},
	run: runGroup,
}

func runGroup(e *env, _ *flag.FlagSet, pos []string) int {
	sub, name, code, ok := e.subcommand(pos, "list", "reset", "delete")
	if !ok {
		return code
	}
	if sub == "list" {
		if e.o.resetTo != "" || len(e.o.offsets) > 0 || len(e.o.partitions) > 0 || e.o.force {
			return e.usageError("list takes no --to, --offset, --partition or --force")
		}
		return groupList(e, name)
	}
	var to queen.ResetTo
	if sub == "reset" {
		switch {
		case e.o.resetTo != "" && len(e.o.offsets) > 0:
			return e.usageError("--to and --offset: give one")
		case len(e.o.offsets) > 0:
			if len(e.o.partitions) > 0 {
				return e.usageError("--offset names its partitions: no --partition with it")
			}
			m := map[string]int64{}
			for _, s := range e.o.offsets {
				p, n, ok := strings.Cut(s, "=")
				off, err := strconv.ParseInt(n, 10, 64)
				if !ok || p == "" || err != nil || off < 0 {
					return e.usageError("--offset %s: want PARTITION=N, N an offset (0 or more)", shown(s))
				}
				if _, dup := m[p]; dup {
					return e.usageError("--offset: partition %s given twice", shown(p))
				}
				m[p] = off
			}
			to = queen.ResetToOffsets(m)
		case e.o.resetTo == "earliest":
			to = queen.ResetEarliest()
		case e.o.resetTo == "latest":
			to = queen.ResetLatest()
		case e.o.resetTo == "":
			return e.usageError("reset: give --to earliest|latest|TIME or --offset P=N")
		default:
			t, err := when(e.o.resetTo, time.Now())
			if err != nil {
				return e.usageError("--to: want earliest, latest or a time: %v", err)
			}
			to = queen.ResetToTime(t)
		}
	} else if e.o.resetTo != "" || len(e.o.offsets) > 0 || len(e.o.partitions) > 0 {
		return e.usageError("delete takes no --to, --offset or --partition")
	}
	c, done, code := e.client(4)
	if code != exitOK {
		return code
	}
	defer done()
	q := c.Queue(name)
	if sub == "delete" {
		d, err := q.DeleteGroup(e.ctx, e.o.group, queen.DeleteGroupOptions{Force: e.o.force})
		if err != nil {
			return e.fail(err)
		}
		if e.o.json {
			return e.writeJSON(struct {
				Queue       string `json:"queue"`
				Group       string `json:"group"`
				Cursors     int    `json:"cursors"`
				LeasesEnded int    `json:"leases_ended"`
			}{name, e.o.group, d.Cursors, d.LeasesEnded})
		}
		fmt.Fprintf(e.stdout, "deleted group %s of queue %q: %d cursors removed", groupName(e.o.group), name, d.Cursors)
		if d.LeasesEnded > 0 {
			fmt.Fprintf(e.stdout, ", %d live leases ended", d.LeasesEnded)
		}
		fmt.Fprintln(e.stdout)
		return exitOK
	}
	moves, err := q.ResetGroup(e.ctx, e.o.group, to, queen.ResetOptions{Partitions: e.o.partitions, Force: e.o.force})
	if err != nil {
		return e.fail(err)
	}
	if e.o.json {
		type move struct {
			Partition  string `json:"partition"`
			Before     int64  `json:"before"`
			After      int64  `json:"after"`
			Created    bool   `json:"created"`
			LeaseEnded bool   `json:"lease_ended"`
		}
		out := struct {
			Queue      string `json:"queue"`
			Group      string `json:"group"`
			Partitions []move `json:"partitions"`
		}{Queue: name, Group: e.o.group, Partitions: []move{}}
		for _, m := range moves {
			out.Partitions = append(out.Partitions, move(m))
		}
		return e.writeJSON(out)
	}
	fmt.Fprintf(e.stdout, "reset group %s of queue %q: %d cursors moved\n", groupName(e.o.group), name, len(moves))
	if len(moves) == 0 {
		return exitOK
	}
	w := table(e.stdout)
	fmt.Fprintln(w, "PARTITION\tBEFORE\tAFTER\tNOTE")
	for _, m := range moves {
		var note []string
		if m.Created {
			note = append(note, "new cursor")
		}
		if m.LeaseEnded {
			note = append(note, "lease ended")
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", m.Partition, m.Before, m.After, strings.Join(note, ", "))
	}
	if err := w.Flush(); err != nil {
		return e.errorf(exitError, "write: %v", err)
	}
	return exitOK
}

var cmdLease = &command{
	name:     "lease",
	synopsis: "release <queue> --partition P [--group NAME]",
	short:    "end a consumer group's lease on a partition now",
	long: `release ends the group's (--group, default "": queue mode) live lease on the
partition now, as if it had expired: its messages go to the group's next claim,
not charged as failures; the holder's acks and renewals are refused from then
on (a Consume drops the batch). Use it for a consumer that hangs on a batch.
Releasing where there is no live lease does nothing (and says so).`,
	flags: func(fs *flag.FlagSet, o *opts) {
		fs.StringVar(&o.group, "group", "", "the consumer `group` (default \"\": queue mode)")
		fs.StringVar(&o.partition, "partition", "", "the `partition` (required)")
	},
	run: func(e *env, _ *flag.FlagSet, pos []string) int {
		_, name, code, ok := e.subcommand(pos, "release")
		if !ok {
			return code
		}
		if e.o.partition == "" {
			return e.usageError("--partition is required")
		}
		c, done, code := e.client(4)
		if code != exitOK {
			return code
		}
		defer done()
		ok, err := c.Queue(name).ReleaseLease(e.ctx, e.o.group, e.o.partition)
		if err != nil {
			return e.fail(err)
		}
		if e.o.json {
			return e.writeJSON(struct {
				Queue     string `json:"queue"`
				Group     string `json:"group"`
				Partition string `json:"partition"`
				Released  bool   `json:"released"`
			}{name, e.o.group, e.o.partition, ok})
		}
		if ok {
			fmt.Fprintf(e.stdout, "released the lease of group %s on %q partition %q\n", groupName(e.o.group), name, e.o.partition)
		} else {
			fmt.Fprintf(e.stdout, "group %s holds no live lease on %q partition %q: nothing to release\n", groupName(e.o.group), name, e.o.partition)
		}
		return exitOK
	},
}

// failOffsets is fail for the offsets commands' own sentinels.
func (e *env) failOffsets(err error) (int, bool) {
	switch {
	case errors.Is(err, queen.ErrNotFound):
		return e.errorf(exitNotFound, "%v (\"queen status <queue>\" lists its partitions and groups)", err), true
	case errors.Is(err, queen.ErrGroupActive):
		return e.errorf(exitError, "%v: a consumer is handling a batch; stop the group's consumers, or pass --force", err), true
	}
	return 0, false
}

// groupList prints the queue's consumer groups with their live members.
func groupList(e *env, name string) int {
	c, done, code := e.client(4)
	if code != exitOK {
		return code
	}
	defer done()
	if code := e.mustQueue(c, name); code != exitOK {
		return code
	}
	qs, err := c.Queues(e.ctx)
	if err != nil {
		return e.fail(err)
	}
	var groups []queen.QueueGroupInfo
	for _, qi := range qs {
		if qi.Name == name {
			groups = qi.Groups
		}
	}
	state := func(g queen.QueueGroupInfo) string {
		switch {
		case g.Paused:
			return "paused"
		case g.Abandoned:
			return "abandoned"
		}
		return "running"
	}
	if e.o.json {
		type member struct {
			ID       string    `json:"id"`
			Client   string    `json:"client"`
			Host     string    `json:"host"`
			PID      int       `json:"pid"`
			Started  time.Time `json:"started"`
			LastSeen time.Time `json:"last_seen"`
		}
		type group struct {
			Group         string   `json:"group"`
			Lag           int64    `json:"lag"`
			LagAgeSeconds float64  `json:"lag_age_seconds"`
			State         string   `json:"state"`
			Members       []member `json:"members"`
		}
		out := struct {
			Queue  string  `json:"queue"`
			Groups []group `json:"groups"`
		}{Queue: name, Groups: []group{}}
		for _, g := range groups {
			j := group{Group: g.Group, Lag: g.Lag, LagAgeSeconds: g.LagAge.Seconds(), State: state(g), Members: []member{}}
			for _, m := range g.Members {
				j.Members = append(j.Members, member(m))
			}
			out.Groups = append(out.Groups, j)
		}
		return e.writeJSON(out)
	}
	if len(groups) == 0 {
		fmt.Fprintf(e.stdout, "queue %q has no consumer groups yet\n", name)
		return exitOK
	}
	w := table(e.stdout)
	fmt.Fprintln(w, "GROUP\tLAG\tOLDEST\tSTATE\tMEMBERS")
	for _, g := range groups {
		oldest := "-"
		if g.Lag > 0 {
			oldest = age(g.LagAge)
		}
		var ms []string
		for _, m := range g.Members {
			ms = append(ms, fmt.Sprintf("%s (%s/%d, seen %s ago)", m.ID, m.Host, m.PID, age(time.Since(m.LastSeen))))
		}
		members := "-"
		if len(ms) > 0 {
			members = strings.Join(ms, ", ")
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", groupName(g.Group), g.Lag, oldest, state(g), members)
	}
	if err := w.Flush(); err != nil {
		return e.errorf(exitError, "write: %v", err)
	}
	return exitOK
}
