// Package history records what clients of a queue did and saw, and checks the
// record against the queue's promises: every item reported stored is stored
// exactly once, offsets are gapless, a client's pushes to a partition keep
// their order, deliveries agree with the log and come in order, one holder per
// (partition, group) at a time, and every stored message reaches every group.
//
// The recorder and the checker know nothing about how the operations were
// run; the randomized runner that drives real clients against a real
// PostgreSQL with injected faults lives in this package's tests.
package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Kinds of operation.
const (
	OpPush    = "push"    // Queue.Push, Queue.PushTx or Tx.Push
	OpPop     = "pop"     // Queue.Pop (and each batch a Consume worker got)
	OpSettle  = "settle"  // Ack, Fail, Retry, DeadLetter, ExtendLease
	OpHandler = "handler" // one Consume handler run
	OpFault   = "fault"   // an injected fault, for the report
	// OpClaim is a batch one of Consume's own claims took (its Debug log
	// line): Partition, Offset (the first), Last, Batch (messages), Lease.
	// Evidence only: it shows which claim took a message nobody handled.
	OpClaim = "claim"
	// OpCall is any other public call, named by Kind: "pause", "resume",
	// "delete", "requeue" (Msgs: the dead letters it was given, of Group, at
	// or below its MaxID; Kept: those above it),
	// "peek" (Msgs: what it read), "deadletters", "configure", "status",
	// "consume" (the Consume call itself), "status" (Lag: one row it read), "settle-log" (Consume's own
	// settle failure, from its log: Err), "cursor" (Group's committed
	// Offset on Partition as Queue.Status read it, recorded after the read),
	// "metrics" (Counts: a client's consume-side counters of Queue and
	// Group), "from-edge" (Group subscribes from the call's start on
	// Partition; it completed before the commit of a PushTx holding the
	// partition's row began), "rewrite" (segments overwritten behind the clients' backs: Msgs,
	// Unreadable).
	OpCall = "call"
)

// Phases of an operation, as in Jepsen: an invoke, then ok (it happened),
// fail (it certainly did not) or info (unknown: an error, a timeout, a killed
// process).
const (
	Invoke = "invoke"
	OK     = "ok"
	Fail   = "fail"
	Info   = "info"
)

// Event is one line of a history. An operation is an Invoke event followed by
// at most one completion with the same Proc and Seq; a process that dies
// leaves its open operations without one, and the checker treats those as
// Info.
type Event struct {
	// Proc names the client (one Client: its process and spool), e.g.
	// "main-0" or "child-1.3" (child 1, third incarnation).
	Proc string `json:"proc"`
	// Seq numbers the operations of one Proc; invoke and completion share it.
	Seq   int64  `json:"seq"`
	Op    string `json:"op"`
	Phase string `json:"phase"`
	// T is the wall clock in Unix nanoseconds: every process of a run shares
	// the machine's clock.
	T     int64  `json:"t"`
	Queue string `json:"queue,omitempty"`
	Group string `json:"group,omitempty"`

	// Push: the items on invoke, their results on completion (input order).
	Items   []Item   `json:"items,omitempty"`
	Results []Result `json:"results,omitempty"`
	// Tx is set for pushes inside a transaction the caller rolled back on
	// purpose (Rollback: nothing may be stored).
	Rollback bool `json:"rollback,omitempty"`

	// Pop: what was delivered. AutoAck deliveries are settled by the pop.
	AutoAck bool       `json:"autoack,omitempty"`
	Batch   int        `json:"batch,omitempty"` // the pop's Batch
	Msgs    []Delivery `json:"msgs,omitempty"`
	// Keys: of a pop (on its completion) or a handler, each delivery's
	// Message.Key, parallel to Msgs, where the generator records them.
	Keys []string `json:"keys,omitempty"`
	// Kept: of a "requeue" call, the dead letters it was given the ids of
	// but that lie above its MaxID: it must not requeue them.
	Kept []Delivery `json:"kept,omitempty"`
	// BadData: of a pop (on its completion) or a handler, the deliveries
	// whose Data was not the payload pushed with their transaction id.
	BadData []Delivery `json:"bad_data,omitempty"`
	// Lag: of a "status" call, one group's row of one partition as
	// Queue.Status read it (Partition, Group).
	Lag *LagRead `json:"lag,omitempty"`
	// Counts: of a "metrics" call, what the client's MeterProvider read
	// after it closed, for Queue and Group: ack, fail, retry, dead_letter,
	// released (queen.client.settled.messages), receive and process
	// (messaging.client.consumed.messages).
	Counts map[string]int64 `json:"counts,omitempty"`
	// Procs: of a "metrics" call, the other procs whose calls may have
	// gone through the same client.
	Procs []string `json:"procs,omitempty"`

	// Settle and Handler: one message.
	Kind      string `json:"kind,omitempty"` // ack, fail, retry, dead, extend
	Partition string `json:"partition,omitempty"`
	Offset    int64  `json:"offset,omitempty"`
	Lease     string `json:"lease,omitempty"`
	ID        string `json:"id,omitempty"`
	// Last is a claim's last offset.
	Last int64 `json:"last,omitempty"`

	// Err is the error text of a fail or info completion.
	Err string `json:"err,omitempty"`
	// ItemErr is the error of a push's first failed item (Push fails
	// items in its results, not the call).
	ItemErr string `json:"item_err,omitempty"`
	// LeaseLost marks a settle refused because the lease was gone.
	LeaseLost bool `json:"lease_lost,omitempty"`
	// Keyed marks a settle of a message of a Consume handler with
	// KeyConcurrency > 1 (Tx.Ack): it settles that offset alone, not the
	// cursor through it. Of a "consume" call: its KeyConcurrency is above
	// 1, so its partitions keep order only per key.
	Keyed bool `json:"keyed,omitempty"`
	// Invalid marks a call given input it must reject (a bad name, key,
	// header or size, a Lanes change on a keyed queue): it must fail,
	// and change nothing.
	Invalid bool `json:"invalid,omitempty"`
	// WrongKey marks a pop or handler of a client whose keys cannot open
	// the queue's payloads: it must deliver nothing from an encrypted queue.
	WrongKey bool `json:"wrong_key,omitempty"`
	// Unreadable: of a "rewrite" call (stored messages overwritten under
	// their keys; Msgs: what each rewritten offset holds now), the
	// messages whose stored payload can no longer be opened.
	Unreadable []Delivery `json:"unreadable,omitempty"`
	// Secret is a password the call was given (in a database URL): no
	// error of it may show a piece of it.
	Secret string `json:"secret,omitempty"`
	// Deadline is when the call promised to have returned, in Unix
	// nanoseconds: Close's context deadline; for Open against a server
	// that never answers, its start plus StatementTimeout.
	Deadline int64 `json:"deadline,omitempty"`
	// DeliverAt: of a push (its completion or invoke), each item's
	// Item.DeliverAt in Unix nanoseconds (0: none), in input order
	// (check_sched.go).
	DeliverAt []int64 `json:"deliver_at,omitempty"`

	// Moving offsets (check_offsets.go). Reset: the ResetTo kind
	// (earliest, latest, time, offsets); At: ResetToTime's time in Unix
	// nanoseconds; Want: ResetToOffsets' next offset per partition; Parts:
	// ResetOptions.Partitions; Force: ResetOptions.Force or
	// DeleteGroupOptions.Force. Absent marks a call naming a partition or
	// group that does not exist: it must be refused (ErrNotFound).
	Reset  string           `json:"reset,omitempty"`
	At     int64            `json:"at,omitempty"`
	Want   map[string]int64 `json:"want,omitempty"`
	Parts  []string         `json:"parts,omitempty"`
	Force  bool             `json:"force,omitempty"`
	Absent bool             `json:"absent,omitempty"`
	// On completion: what ResetGroup returned; DeleteGroup's
	// GroupDeleted.LeasesEnded (Ended); ReleaseLease's result (Released).
	Moves    []Move `json:"moves,omitempty"`
	Ended    int    `json:"ended,omitempty"`
	Released bool   `json:"released,omitempty"`
	// Refusal: of a refused call, ErrGroupActive ("active") or
	// ErrNotFound ("not-found").
	Refusal string `json:"refusal,omitempty"`
}

// Move is one queen.OffsetMove: a cursor's committed offset before and
// after a reset (Created: the reset made the cursor).
type Move struct {
	Partition  string `json:"p"`
	Before     int64  `json:"before"`
	After      int64  `json:"after"`
	Created    bool   `json:"created,omitempty"`
	LeaseEnded bool   `json:"ended,omitempty"`
}

// LagRead is what one Queue.Status read said of a group on a partition.
type LagRead struct {
	LastOffset int64 `json:"last"`
	LogStart   int64 `json:"start"`
	Committed  int64 `json:"comm"`
	Settled    int   `json:"settled"`
	Lag        int64 `json:"lag"`
}

// Item is one pushed item.
type Item struct {
	Partition string `json:"p"`
	TxID      string `json:"tx"`
}

// Result is one item's push result.
type Result struct {
	Status string `json:"s"` // queued, duplicate, buffered, failed
	ID     string `json:"id,omitempty"`
	Offset int64  `json:"o"`
}

// Delivery is one delivered message.
type Delivery struct {
	Partition string `json:"p"`
	Offset    int64  `json:"o"`
	ID        string `json:"id"`
	TxID      string `json:"tx"`
	Lease     string `json:"lease,omitempty"`
	Attempt   int    `json:"a"`
	// LeaseExpires is the lease's end in Unix nanoseconds (0 for AutoAck).
	LeaseExpires int64 `json:"exp,omitempty"`
}

// Recorder appends events, from any goroutine, as JSON lines.
type Recorder struct {
	mu     sync.Mutex
	w      *bufio.Writer
	events []Event // kept in memory when no writer, or always for the parent
	seq    map[string]int64
	keep   bool
	err    error
}

// NewRecorder records into w (nil: memory only). keep also keeps every event
// in memory for Events.
func NewRecorder(w io.Writer, keep bool) *Recorder {
	r := &Recorder{seq: map[string]int64{}, keep: keep}
	if w != nil {
		r.w = bufio.NewWriter(w)
	}
	return r
}

// Invoke records the start of an operation and returns it; complete it with
// Done.
func (r *Recorder) Invoke(e Event) Event {
	r.mu.Lock()
	r.seq[e.Proc]++
	e.Seq = r.seq[e.Proc]
	r.mu.Unlock()
	e.Phase = Invoke
	r.add(e)
	return e
}

// Done records the completion of inv: phase OK, Fail or Info with the
// fields of res (Results, Msgs, Err, LeaseLost) filled in by the caller.
func (r *Recorder) Done(inv Event, phase string, res Event) {
	res.Proc, res.Seq, res.Op, res.Phase = inv.Proc, inv.Seq, inv.Op, phase
	if res.Queue == "" {
		res.Queue = inv.Queue
	}
	if res.Group == "" {
		res.Group = inv.Group
	}
	r.add(res)
}

// Add records a finished event as is (e.g. one read from a child's file).
func (r *Recorder) Add(e Event) { r.add(e) }

func (r *Recorder) add(e Event) {
	if e.T == 0 {
		e.T = time.Now().UnixNano()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keep {
		r.events = append(r.events, e)
	}
	if r.w != nil && r.err == nil {
		b, err := json.Marshal(e)
		if err == nil {
			b = append(b, '\n')
			_, err = r.w.Write(b)
		}
		if err == nil {
			// A child may be killed at any instant: what it saw must already
			// be in the pipe.
			err = r.w.Flush()
		}
		r.err = err
	}
}

// Err is the first write error.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Events returns a copy of the kept events.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// ReadFile reads a history written by a Recorder. A torn last line (the
// writer was killed mid-write) is dropped.
func ReadFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f)
}

// Read reads JSON lines; a torn last line is dropped.
func Read(rd io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var bad error
	for sc.Scan() {
		if bad != nil {
			return out, bad // a bad line that was not the last
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			bad = fmt.Errorf("history: bad line after %d events: %w", len(out), err)
			continue
		}
		out = append(out, e)
	}
	return out, sc.Err()
}
