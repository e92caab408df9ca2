package main

import (
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/e03140bc/queen"
)

var cmdDLQ = &command{
	name:     "dlq",
	synopsis: "list|replay|discard <queue> [--id N]... [--partition P] [--group G]... [--since T] [--until T] [--dry-run]",
	short:    "list dead letters, replay them to their partitions, or discard them",
	long: `list prints the queue's dead letters, oldest first: id, partition, group, offset,
attempts, when it died, reason and a payload preview. At most --limit (default
100); when there are more it says how to get the next page (--after).

replay appends the dead letters that match back at the tail of their partitions
(with their ids, transaction ids, keys and headers; every group of the queue
reads them, from Attempt 1) and deletes them from the dead letters, in one
transaction per batch: an interrupted replay can simply be run again. It takes
only those there are when it starts, not those dead-lettered meanwhile. --dry-run
lists what would be replayed and changes nothing. Replaying nothing exits 0.

discard deletes the dead letters that match for good (nothing is pushed), as
replay takes them: only those there are when it starts, in batches that can be
run again, --dry-run to list them first. Discarding nothing exits 0.

Filters: --id (repeatable: exactly these dead letters), --partition, --group
(repeatable; "" is queue mode), --since and --until (RFC 3339 times, or a
duration meaning that long ago, e.g. 1h).`,
	flags: func(fs *flag.FlagSet, o *opts) {
		fs.StringVar(&o.partition, "partition", "", "only this `partition`")
		fs.Func("group", "only this consumer `group` (repeatable; \"\" is queue mode)", func(s string) error {
			o.groups, o.groupSet = append(o.groups, s), true
			return nil
		})
		fs.StringVar(&o.since, "since", "", "only dead letters stored at or after this `time` (RFC 3339, or a duration ago)")
		fs.StringVar(&o.until, "until", "", "only dead letters stored before this `time` (RFC 3339, or a duration ago)")
		fs.Func("id", "only the dead letter with this `id` (repeatable)", func(s string) error {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n <= 0 {
				return fmt.Errorf("not a dead letter id: %q", s)
			}
			o.ids = append(o.ids, n)
			return nil
		})
		fs.Int64Var(&o.after, "after", 0, "list: only dead letters with an id above this (the next page)")
		fs.IntVar(&o.limit, "limit", 0, "list: at most this many (default 100, at most 10000); replay, discard: at most this many (default all)")
		fs.BoolVar(&o.dryRun, "dry-run", false, "replay, discard: list what would be done, change nothing")
	},
	run: runDLQ,
}

// when parses an RFC 3339 time or a duration before now.
func when(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2006-01-02T15:04:05Z) nor a duration (1h30m)", s)
}

func runDLQ(e *env, _ *flag.FlagSet, pos []string) int {
	sub, name, code, ok := e.subcommand(pos, "list", "replay", "discard")
	if !ok {
		return code
	}
	now := time.Now()
	query := queen.DeadLetterQuery{Partition: e.o.partition, After: e.o.after, IDs: e.o.ids}
	if e.o.groupSet {
		query.Groups = e.o.groups
	}
	var err error
	if query.Since, err = when(e.o.since, now); err != nil {
		return e.usageError("--since: %v", err)
	}
	if query.Until, err = when(e.o.until, now); err != nil {
		return e.usageError("--until: %v", err)
	}
	if e.o.limit < 0 || (sub == "list" && e.o.limit > 10_000) {
		return e.usageError("--limit must be between 0 and 10000")
	}
	if e.o.partition != "" && !queen.ValidName(e.o.partition) {
		return e.usageError("--partition: invalid name %q", e.o.partition)
	}
	for _, g := range e.o.groups {
		if g != "" && !queen.ValidName(g) {
			return e.usageError("--group: invalid name %q", g)
		}
	}
	if sub != "list" && e.o.after != 0 {
		return e.usageError("--after is for list")
	}
	if sub == "list" && e.o.dryRun {
		return e.usageError("--dry-run is for replay and discard")
	}
	c, done, code := e.client(4)
	if code != exitOK {
		return code
	}
	defer done()
	if code := e.mustQueue(c, name); code != exitOK {
		return code
	}
	q := c.Queue(name)
	if sub == "list" {
		query.Limit = e.o.limit
		if query.Limit == 0 {
			query.Limit = 100
		}
		want := query.Limit
		query.Limit++ // one more says whether there is a next page
		dls, err := q.DeadLetters(e.ctx, query)
		if err != nil {
			return e.fail(err)
		}
		more := len(dls) > want
		if more {
			dls = dls[:want]
		}
		if code := e.printDeadLetters(name, dls); code != exitOK {
			return code
		}
		if more && !e.o.json {
			fmt.Fprintf(e.stderr, "more dead letters: add --after %d for the next page\n", dls[len(dls)-1].ID)
		}
		return exitOK
	}
	// Only the dead letters there are now: a consumer dead-lettering the
	// copies again at once would otherwise keep the replay going, and a
	// discard would delete what nobody saw.
	qs, err := c.Queues(e.ctx)
	if err != nil {
		return e.fail(err)
	}
	for _, qi := range qs {
		if qi.Name == name {
			query.MaxID = qi.LastDeadLetterID
		}
	}
	none := query.MaxID == 0 // MaxID 0 would mean no bound
	verb, past := "replay", "replayed"
	if sub == "discard" {
		verb, past = "discard", "discarded"
	}
	if e.o.dryRun {
		// Page by page: dead letters carry whole payloads.
		var all []queen.DeadLetter
		seen := 0
		for !none {
			page := 1000
			if e.o.limit > 0 {
				page = min(page, e.o.limit-seen)
			}
			if page == 0 {
				break
			}
			query.Limit = page
			dls, err := q.DeadLetters(e.ctx, query)
			if err != nil {
				return e.fail(err)
			}
			if e.o.json {
				all = append(all, dls...)
			} else if len(dls) > 0 {
				if code := e.printDeadLetters(name, dls); code != exitOK {
					return code
				}
			}
			seen += len(dls)
			if len(dls) < page {
				break
			}
			query.After = dls[len(dls)-1].ID
		}
		if e.o.json {
			return e.printDeadLetters(name, all)
		}
		if seen == 0 {
			fmt.Fprintf(e.stdout, "nothing to %s: no dead letters of queue %q match\n", verb, name)
			return exitOK
		}
		fmt.Fprintf(e.stdout, "would %s the %d dead letter%s of queue %q listed above (dry run, nothing changed)\n", verb, seen, plural(seen), name)
		return exitOK
	}
	total := 0
	for !none && (e.o.limit == 0 || total < e.o.limit) {
		query.Limit = 1000
		if e.o.limit > 0 {
			query.Limit = min(1000, e.o.limit-total)
		}
		var n int
		var err error
		if sub == "discard" {
			n, err = q.DiscardDeadLetters(e.ctx, query)
		} else {
			n, err = q.RequeueDeadLetters(e.ctx, query)
		}
		if err != nil {
			if total > 0 {
				fmt.Fprintf(e.stderr, "queen dlq: %d %s before the error; run the command again for the rest\n", total, past)
			}
			return e.fail(err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	if e.o.json && sub == "discard" {
		return e.writeJSON(struct {
			Queue     string `json:"queue"`
			Discarded int    `json:"discarded"`
		}{name, total})
	}
	if e.o.json {
		return e.writeJSON(struct {
			Queue    string `json:"queue"`
			Replayed int    `json:"replayed"`
		}{name, total})
	}
	if total == 0 {
		fmt.Fprintf(e.stdout, "nothing to %s: no dead letters of queue %q match\n", verb, name)
		return exitOK
	}
	if sub == "discard" {
		fmt.Fprintf(e.stdout, "discarded %d dead letter%s of queue %q\n", total, plural(total), name)
		return exitOK
	}
	fmt.Fprintf(e.stdout, "replayed %d message%s of queue %q from its dead letters to the tail of their partitions\n", total, plural(total), name)
	return exitOK
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

type deadLetterJSON struct {
	ID            int64             `json:"id"`
	Queue         string            `json:"queue"`
	Partition     string            `json:"partition"`
	Group         string            `json:"group"`
	Offset        int64             `json:"offset"`
	MessageID     string            `json:"message_id"`
	TransactionID string            `json:"transaction_id"`
	Key           string            `json:"key,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Attempts      int               `json:"attempts"`
	Reason        string            `json:"reason"`
	CreatedAt     time.Time         `json:"created_at"`
	DeadAt        time.Time         `json:"dead_at"`
	Data          *string           `json:"data,omitempty"`
	DataBase64    string            `json:"data_base64,omitempty"`
	// Error is why the payload could not be decoded (DeadLetter.Err).
	Error string `json:"error,omitempty"`
}

func (e *env) printDeadLetters(queue string, dls []queen.DeadLetter) int {
	if e.o.json {
		out := make([]deadLetterJSON, 0, len(dls))
		for _, d := range dls {
			j := deadLetterJSON{ID: d.ID, Queue: d.Queue, Partition: d.Partition, Group: d.Group, Offset: d.Offset,
				MessageID: d.MessageID.String(), TransactionID: d.TransactionID, Key: d.Key, Headers: d.Headers,
				Attempts: d.Attempts, Reason: d.Reason, CreatedAt: d.CreatedAt.UTC(), DeadAt: d.DeadAt.UTC()}
			setData(&j.Data, &j.DataBase64, d.Data)
			if d.Err != nil {
				j.Error = d.Err.Error()
			}
			out = append(out, j)
		}
		return e.writeJSON(out)
	}
	if len(dls) == 0 {
		fmt.Fprintf(e.stdout, "no dead letters of queue %q match\n", queue)
		return exitOK
	}
	tw := table(e.stdout)
	fmt.Fprintln(tw, "ID\tPARTITION\tGROUP\tOFFSET\tATTEMPTS\tDEAD AT\tREASON\tDATA")
	for _, d := range dls {
		reason := "-"
		if d.Reason != "" {
			reason = safe(d.Reason)
		}
		data := preview(d.Data, 60)
		if d.Err != nil {
			data = "(undecodable: " + safe(d.Err.Error()) + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.ID, d.Partition, groupName(d.Group), d.Offset, d.Attempts,
			d.DeadAt.UTC().Format(time.RFC3339), reason, data)
	}
	if err := tw.Flush(); err != nil {
		return e.fail(err)
	}
	return exitOK
}
