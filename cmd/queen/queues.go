package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/e03140bc/queen"
)

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// groupName shows queue mode, whose group name is "", as such.
func groupName(g string) string {
	if g == "" {
		return "(queue mode)"
	}
	return g
}

// age renders a duration in whole seconds ("0s", "3m4s"), "-" for none.
func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	if d < time.Second {
		return "<1s"
	}
	return d.Round(time.Second).String()
}

var cmdQueues = &command{
	name:  "queues",
	short: "list the queues with partitions, depth, dead letters and groups",
	long: `Lists every queue of the tenant, by name: its partition count, depth (unconsumed
messages, counted for the group furthest behind), the age of the oldest
unconsumed message, how many dead letters it holds (DEAD; not part of the
depth), and its consumer groups with their lag ("paused" for a paused group).`,
	run: func(e *env, _ *flag.FlagSet, pos []string) int {
		if code, ok := e.args(pos, 0); !ok {
			return code
		}
		c, done, code := e.client(4)
		if code != exitOK {
			return code
		}
		defer done()
		qs, err := c.Queues(e.ctx)
		if err != nil {
			return e.fail(err)
		}
		if e.o.json {
			out := make([]queueJSON, 0, len(qs))
			for _, q := range qs {
				j := queueJSON{Name: q.Name, Partitions: q.Partitions, Depth: q.Depth, OldestAgeSeconds: q.OldestAge.Seconds(), DeadLetters: q.DeadLetters,
					Options: optionsJSON(q.Options), Groups: []groupJSON{}}
				for _, g := range q.Groups {
					j.Groups = append(j.Groups, groupJSON{g.Group, g.Lag, g.LagAge.Seconds(), g.Paused})
				}
				out = append(out, j)
			}
			return e.writeJSON(out)
		}
		if len(qs) == 0 {
			fmt.Fprintf(e.stdout, "no queues in schema %q\n", c.Schema())
			return exitOK
		}
		tw := table(e.stdout)
		fmt.Fprintln(tw, "QUEUE\tPARTITIONS\tDEPTH\tOLDEST\tDEAD\tGROUPS (LAG)")
		for _, q := range qs {
			var gs []string
			for _, g := range q.Groups {
				s := fmt.Sprintf("%s=%d", groupName(g.Group), g.Lag)
				if g.Paused {
					s += " (paused)"
				}
				gs = append(gs, s)
			}
			if len(gs) == 0 {
				gs = []string{"-"}
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%s\n", q.Name, q.Partitions, q.Depth, age(q.OldestAge), q.DeadLetters, strings.Join(gs, ", "))
		}
		if err := tw.Flush(); err != nil {
			return e.fail(err)
		}
		return exitOK
	},
}

type queueJSON struct {
	Name             string         `json:"name"`
	Partitions       int            `json:"partitions"`
	Depth            int64          `json:"depth"`
	OldestAgeSeconds float64        `json:"oldest_age_seconds"`
	DeadLetters      int64          `json:"dead_letters"`
	Options          map[string]any `json:"options"`
	Groups           []groupJSON    `json:"groups"`
}

type groupJSON struct {
	Group         string  `json:"group"`
	Lag           int64   `json:"lag"`
	LagAgeSeconds float64 `json:"lag_age_seconds"`
	Paused        bool    `json:"paused"`
}

func optionsJSON(o queen.QueueOptions) map[string]any {
	return map[string]any{
		"lease_time_seconds":          o.LeaseTime.Seconds(),
		"retry_limit":                 o.RetryLimit,
		"dead_letter":                 o.DeadLetter,
		"dedup_window_seconds":        o.DedupWindow.Seconds(),
		"encryption":                  o.Encryption,
		"delayed_processing_seconds":  o.DelayedProcessing.Seconds(),
		"window_buffer_seconds":       o.WindowBuffer.Seconds(),
		"retention_seconds":           o.Retention.Seconds(),
		"completed_retention_seconds": o.CompletedRetention.Seconds(),
		"failure_policy":              string(o.FailurePolicy),
		"lanes":                       o.Lanes,
	}
}

var cmdStatus = &command{
	name:     "status",
	synopsis: "<queue>",
	short:    "show a queue's partitions, cursors, lag and leases",
	long: `Shows, per partition, its newest offset (LAST, -1 when empty) and oldest retained
one (START), and per consumer group on it the committed offset, the lag in
messages and in age, the lease holder (host/pid/client) with the offset the
lease runs through and when it expires, and the failures charged. A partition no
group has read yet shows "-" for its group.`,
	run: func(e *env, _ *flag.FlagSet, pos []string) int {
		if code, ok := e.args(pos, 1); !ok {
			return code
		}
		c, done, code := e.client(4)
		if code != exitOK {
			return code
		}
		defer done()
		if code := e.mustQueue(c, pos[0]); code != exitOK {
			return code
		}
		st, err := c.Queue(pos[0]).Status(e.ctx)
		if err != nil {
			return e.fail(err)
		}
		if e.o.json {
			return e.writeJSON(statusJSON(st))
		}
		if len(st.Partitions) == 0 {
			fmt.Fprintf(e.stdout, "queue %q has no partitions: nothing was pushed to it\n", st.Queue)
			return exitOK
		}
		tw := table(e.stdout)
		fmt.Fprintln(tw, "PARTITION\tLAST\tSTART\tGROUP\tCOMMITTED\tLAG\tLAG AGE\tFAILURES\tLEASE")
		for _, p := range st.Partitions {
			if len(p.Groups) == 0 {
				fmt.Fprintf(tw, "%s\t%d\t%d\t-\t-\t-\t-\t-\t-\n", p.Name, p.LastOffset, p.LogStart)
			}
			for _, g := range p.Groups {
				lease := "-"
				if g.Leased {
					lease = fmt.Sprintf("%s through %d, expires in %s", g.LeaseOwner, g.LeaseEnd, age(time.Until(g.LeaseExpiresAt)))
				}
				name := groupName(g.Group)
				if g.Paused {
					name += " (paused)"
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%s\t%d\t%s\n", p.Name, p.LastOffset, p.LogStart, name, g.Committed, g.Lag,
					age(g.LagAge), g.Failures, lease)
			}
		}
		if err := tw.Flush(); err != nil {
			return e.fail(err)
		}
		return exitOK
	},
}

type partitionJSON struct {
	Name        string            `json:"name"`
	LastOffset  int64             `json:"last_offset"`
	LogStart    int64             `json:"log_start"`
	LastWriteAt time.Time         `json:"last_write_at"`
	Groups      []groupStatusJSON `json:"groups"`
}

type groupStatusJSON struct {
	Group          string     `json:"group"`
	Committed      int64      `json:"committed"`
	Lag            int64      `json:"lag"`
	LagAgeSeconds  float64    `json:"lag_age_seconds"`
	Paused         bool       `json:"paused"`
	Failures       int        `json:"failures"`
	Leased         bool       `json:"leased"`
	LeaseEnd       *int64     `json:"lease_end,omitempty"`
	LeaseOwner     string     `json:"lease_owner,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
}

func statusJSON(st queen.QueueStatus) any {
	parts := make([]partitionJSON, 0, len(st.Partitions))
	for _, p := range st.Partitions {
		pj := partitionJSON{Name: p.Name, LastOffset: p.LastOffset, LogStart: p.LogStart, LastWriteAt: p.LastWriteAt.UTC(),
			Groups: []groupStatusJSON{}}
		for _, g := range p.Groups {
			gj := groupStatusJSON{Group: g.Group, Committed: g.Committed, Lag: g.Lag, LagAgeSeconds: g.LagAge.Seconds(),
				Paused: g.Paused, Failures: g.Failures, Leased: g.Leased}
			if g.Leased {
				end, exp := g.LeaseEnd, g.LeaseExpiresAt.UTC()
				gj.LeaseEnd, gj.LeaseOwner, gj.LeaseExpiresAt = &end, g.LeaseOwner, &exp
			}
			pj.Groups = append(pj.Groups, gj)
		}
		parts = append(parts, pj)
	}
	return struct {
		Queue      string          `json:"queue"`
		Partitions []partitionJSON `json:"partitions"`
	}{st.Queue, parts}
}

func pauseCommand(name string, pause bool) *command {
	short, long := "stop a consumer group from claiming on a queue", `Pauses the group (--group, default "": queue mode) on the queue in every process
until "queen resume": pops return nothing and Consume idles; pushes still land.
Leases already held are not affected: their holders finish. It is durable (a row
in the database) and pausing a paused group does nothing.`
	if !pause {
		short, long = "let a paused consumer group claim again", `Resumes the group (--group, default "": queue mode) on the queue and wakes its
waiting consumers at once, in every process. Resuming a group that is not
paused does nothing.`
	}
	return &command{
		name:     name,
		synopsis: "<queue> [--group NAME]",
		short:    short,
		long:     long,
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.StringVar(&o.group, "group", "", "the consumer `group` (default \"\": queue mode)")
		},
		run: func(e *env, _ *flag.FlagSet, pos []string) int {
			if code, ok := e.args(pos, 1); !ok {
				return code
			}
			c, done, code := e.client(4)
			if code != exitOK {
				return code
			}
			defer done()
			// Pause would create a missing queue: a typo must not.
			if code := e.mustQueue(c, pos[0]); code != exitOK {
				return code
			}
			q := c.Queue(pos[0])
			var err error
			if pause {
				err = q.Pause(e.ctx, e.o.group)
			} else {
				err = q.Resume(e.ctx, e.o.group)
			}
			if err != nil {
				return e.fail(err)
			}
			if e.o.json {
				return e.writeJSON(struct {
					Queue  string `json:"queue"`
					Group  string `json:"group"`
					Paused bool   `json:"paused"`
				}{pos[0], e.o.group, pause})
			}
			verb := "paused"
			if !pause {
				verb = "resumed"
			}
			fmt.Fprintf(e.stdout, "%s group %s on queue %q\n", verb, groupName(e.o.group), pos[0])
			return exitOK
		},
	}
}

var (
	cmdPause  = pauseCommand("pause", true)
	cmdResume = pauseCommand("resume", false)
)

var cmdMaintenance = &command{
	name:     "maintenance",
	synopsis: "on|off|status",
	short:    "turn maintenance mode on or off, or show it",
	long: `Maintenance mode (schema-wide) makes every process send its pushes to its disk
spool without writing to PostgreSQL, for a migration or a failover; "off" makes
them drain their spools. "status" shows the mode.`,
	run: func(e *env, _ *flag.FlagSet, pos []string) int {
		if code, ok := e.args(pos, 1); !ok {
			return code
		}
		var set *bool
		switch pos[0] {
		case "on", "off":
			v := pos[0] == "on"
			set = &v
		case "status":
		default:
			return e.usageError("want on, off or status, not %s", shown(pos[0]))
		}
		c, done, code := e.client(2)
		if code != exitOK {
			return code
		}
		defer done()
		if set != nil {
			if err := c.SetMaintenance(e.ctx, *set); err != nil {
				return e.fail(err)
			}
		}
		on := c.Maintenance()
		if e.o.json {
			return e.writeJSON(struct {
				Schema      string `json:"schema"`
				Maintenance bool   `json:"maintenance"`
			}{c.Schema(), on})
		}
		switch {
		case set == nil && on:
			fmt.Fprintf(e.stdout, "maintenance mode is on in schema %q: pushes go to the spools\n", c.Schema())
		case set == nil:
			fmt.Fprintf(e.stdout, "maintenance mode is off in schema %q\n", c.Schema())
		case on:
			fmt.Fprintf(e.stdout, "maintenance mode on in schema %q: every process now spools its pushes until \"queen maintenance off\"\n", c.Schema())
		default:
			fmt.Fprintf(e.stdout, "maintenance mode off in schema %q: processes drain their spools\n", c.Schema())
		}
		return exitOK
	},
}
