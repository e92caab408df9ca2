package main

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/e03140bc/queen"
)

var cmdTail = &command{
	name:     "tail",
	synopsis: "<queue> [--partition NAME] [--limit N] [--from OFFSET] [--follow]",
	short:    "print a queue's newest messages, and follow new ones",
	long: `Prints the last --limit messages of each partition (or of --partition), by
partition name, then offset, one per line: partition, offset, key, payload. It
reads without leasing and moves no cursor (Queue.Peek). Payloads that are not
printable text are shown quoted, or as hex when not UTF-8; --json writes one
object per line with the whole payload ("data", or "data_base64" when it is not
UTF-8), its ids, key and headers.

--follow keeps polling every --interval for messages after the last offset
shown, in every partition (new partitions included), until interrupted (exit 0).`,
	flags: func(fs *flag.FlagSet, o *opts) {
		fs.StringVar(&o.partition, "partition", "", "only this `partition`")
		fs.IntVar(&o.limit, "limit", 10, "how many of the newest messages per partition to print first")
		fs.Int64Var(&o.after, "from", -1, "start at this `offset` in each partition instead of the newest --limit")
		fs.BoolVar(&o.follow, "follow", false, "keep printing new messages until interrupted")
		fs.DurationVar(&o.interval, "interval", time.Second, "how often --follow polls")
	},
	run: runTail,
}

func runTail(e *env, _ *flag.FlagSet, pos []string) int {
	if code, ok := e.args(pos, 1); !ok {
		return code
	}
	if e.o.limit < 0 || e.o.limit > queen.MaxBatch {
		return e.usageError("--limit must be between 0 and %d", queen.MaxBatch)
	}
	if e.o.partition != "" && !queen.ValidName(e.o.partition) {
		return e.usageError("--partition: invalid name %q", e.o.partition)
	}
	if e.o.interval <= 0 {
		return e.usageError("--interval must be positive")
	}
	c, done, code := e.client(4)
	if code != exitOK {
		return code
	}
	defer done()
	if code := e.mustQueue(c, pos[0]); code != exitOK {
		return code
	}
	q := c.Queue(pos[0])
	// next is, per partition, the first offset not printed yet.
	next := map[string]int64{}
	first := true
	for {
		st, err := q.Status(e.ctx)
		if err != nil {
			if !first && e.ctx.Err() != nil {
				return exitOK
			}
			return e.fail(err)
		}
		found := e.o.partition == ""
		for _, p := range st.Partitions {
			if e.o.partition != "" && p.Name != e.o.partition {
				continue
			}
			found = true
			from, seen := next[p.Name]
			switch {
			case !seen && e.o.after >= 0:
				from = e.o.after
			case !seen && first:
				from = max(p.LogStart, p.LastOffset-int64(e.o.limit)+1)
			case !seen:
				from = p.LogStart // a partition that appeared while following
			case from > p.LastOffset+1:
				from = p.LogStart // purged while idle and pushed to again: offsets restarted
			}
			for from <= p.LastOffset {
				msgs, err := q.Peek(e.ctx, queen.PeekOptions{Partition: p.Name, From: from, Limit: 1000})
				if err != nil {
					if !first && e.ctx.Err() != nil {
						return exitOK
					}
					return e.fail(err)
				}
				if len(msgs) == 0 {
					// Retention removed them meanwhile.
					from = p.LastOffset + 1
					break
				}
				for _, m := range msgs {
					if code := e.printMessage(m); code != exitOK {
						return code
					}
				}
				from = msgs[len(msgs)-1].Offset + 1
			}
			next[p.Name] = from
		}
		if first && !found {
			if !e.o.follow {
				return e.errorf(exitNotFound, "queue %q has no partition %q", pos[0], e.o.partition)
			}
		}
		first = false
		if !e.o.follow {
			return exitOK
		}
		select {
		case <-e.ctx.Done():
			return exitOK
		case <-time.After(e.o.interval):
		}
	}
}

type messageJSON struct {
	Queue         string            `json:"queue"`
	Partition     string            `json:"partition"`
	Offset        int64             `json:"offset"`
	ID            string            `json:"id"`
	TransactionID string            `json:"transaction_id"`
	Key           string            `json:"key,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	CreatedAt     time.Time         `json:"created_at"`
	Data          *string           `json:"data,omitempty"`
	DataBase64    string            `json:"data_base64,omitempty"`
}

func (e *env) printMessage(m *queen.Message) int {
	if e.o.json {
		j := messageJSON{Queue: m.Queue, Partition: m.Partition, Offset: m.Offset, ID: m.ID.String(),
			TransactionID: m.TransactionID, Key: m.Key, Headers: m.Headers, CreatedAt: m.CreatedAt.UTC()}
		setData(&j.Data, &j.DataBase64, m.Data)
		enc := json.NewEncoder(e.stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(j); err != nil {
			return e.fail(err)
		}
		return exitOK
	}
	key := m.Key
	if key == "" {
		key = "-"
	} else {
		key = safe(key)
	}
	if _, err := fmt.Fprintf(e.stdout, "%s  %d  %s  %s\n", m.Partition, m.Offset, key, preview(m.Data, 200)); err != nil {
		return e.fail(err)
	}
	return exitOK
}

// setData puts data into a JSON text field when it is UTF-8, else base64.
func setData(text **string, b64 *string, data []byte) {
	if utf8.Valid(data) {
		s := string(data)
		*text = &s
		return
	}
	*b64 = base64.StdEncoding.EncodeToString(data)
}

// preview renders at most max bytes of a payload for a terminal: the text
// when it is printable, quoted when it holds control characters (no
// escape sequence reaches the terminal), hex when it is not UTF-8.
func preview(data []byte, max int) string {
	cut := ""
	if len(data) > max {
		n := max
		for n > 0 && !utf8.RuneStart(data[n]) {
			n--
		}
		data, cut = data[:n], "…"
	}
	if !utf8.Valid(data) {
		return "0x" + fmt.Sprintf("%x", data) + cut
	}
	return safe(string(data)) + cut
}

// safe quotes s when it holds anything but printable characters and
// spaces.
func safe(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) && r != ' ' {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}
