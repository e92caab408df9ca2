package history_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/history"
	"github.com/e03140bc/queen/internal/segment"
)

// The "faults" generator: faults the nemesis draws too rarely for an 8 s
// seed, each on queues of its own, made densely enough that every seed
// meets each several times. Two loops beside the workers:
//
//   - rewrites: stored segments overwritten under their keys. The
//     ciphertexts of two messages of an encrypted queue swapped (both must
//     be dead-lettered, never opened as the other's data); a segment a
//     client read part of replaced by other messages (a restore: the rest
//     is read as it is now, not from the client's cache); one partition's
//     segment of a three-partition pop corrupted (dead-lettered alone, the
//     rest delivered); a segment corrupted around an offset a per-key
//     Consume settled out of order (its run is dead-lettered at once, the
//     partition goes on); and an idle partition purged between two pushes of
//     one transaction id inside the dedup window (the second is a
//     Duplicate).
//   - hasty: a client whose StatementTimeout (1 ms) is shorter than a
//     spool write: its pushes spool, and an item is Buffered once its
//     record is synced, never Failed while the write goes on (the heal's
//     drain stores it: aborted-write).
//   - spools: a client without a key spools, in maintenance mode, a record
//     that can never be replayed (its queue is switched to encryption
//     meanwhile) ahead of records of two partitions of a queue without a
//     dedup window, one of them locked past its statement timeout for the
//     replay passes that quarantine the poison record: each record is
//     stored once, none is lost. In the same window it pushes to an
//     encrypted queue it has seen: refused, never Buffered.
type faultGen struct {
	r     *run
	c     *queen.Client // holds the run's key
	admin *queen.Client
	rng   *rand.Rand
	n     atomic.Int64

	hastyRounds atomic.Int32
}

// faultsStep bounds one scenario once begun: it ends what it started
// (maintenance off, locks released, its spool drained) after the run's
// generation ended too.
const faultsStep = 20 * time.Second

// startFaults starts the generator's loops on wg until gen ends; the
// keyless client's spool is drained at heal like every other.
func (r *run) startFaults(gen, ctx context.Context, wg *sync.WaitGroup, c, admin *queen.Client) {
	f := &faultGen{r: r, c: c, admin: admin, rng: rand.New(rand.NewPCG(r.seed, 0xfa175))}
	dir := r.t.TempDir()
	r.spoolDirs = append(r.spoolDirs, dir)
	cfg := r.config("faults-nokey", dir)
	cfg.EncryptionKey, cfg.DecryptionKeys = nil, nil
	// A replay pass meets the locked partition's row lock: failed in
	// 300 ms, not the statement timeout, so that three passes (what
	// quarantines a poison record) take about a second.
	cfg.DatabaseURL += "&lock_timeout=300"
	k := r.openCfg(ctx, cfg)
	// A client whose statements time out after a millisecond: a spool
	// write (an fsync) outlasts that. Connecting may take longer.
	dir = r.t.TempDir()
	r.spoolDirs = append(r.spoolDirs, dir)
	cfg = r.config("faults-hasty", dir)
	cfg.DatabaseURL += "&connect_timeout=10"
	cfg.StatementTimeout = time.Millisecond
	hasty := r.openCfg(ctx, cfg)
	// A loop per fault, each as dense as the machine allows. The spool's
	// maintenance window makes pushes of the others Buffered now and then:
	// that round of theirs ends early. A spool round takes a few seconds
	// (three replay passes): none begins near the run's end.
	end, _ := gen.Deadline()
	for i, fn := range []func(context.Context){f.swap, f.corruptPop, f.cacheReplace, f.idlePurge, f.keyedCorrupt, func(ctx context.Context) { f.hasty(ctx, hasty) }, func(ctx context.Context) { f.spool(ctx, k) }} {
		wg.Go(func() {
			for gen.Err() == nil {
				if i == 6 && time.Until(end) < 2*time.Second {
					break
				}
				sctx, cancel := context.WithTimeout(context.WithoutCancel(gen), faultsStep)
				fn(sctx)
				cancel()
			}
			if c := map[int]*queen.Client{5: hasty, 6: k}[i]; c != nil {
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_ = c.Close(cctx)
				cancel()
			}
		})
	}
}

func (f *faultGen) name(kind string) string { return fmt.Sprintf("f%s-%d", kind, f.n.Add(1)) }

// push records and makes one Push of c.
func (f *faultGen) push(ctx context.Context, c *queen.Client, proc, q string, items []queen.Item, invalid bool) ([]queen.PushResult, error) {
	inv := f.r.rec.Invoke(history.Event{Proc: proc, Op: history.OpPush, Queue: q, Items: histItems(items), Invalid: invalid})
	res, err := c.Queue(q).Push(ctx, items)
	switch {
	case err != nil && invalid && errors.Is(err, queen.ErrEncryption):
		f.r.rec.Done(inv, history.Fail, history.Event{Err: err.Error()})
	case err != nil:
		f.r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
	default:
		f.r.rec.Done(inv, history.OK, history.Event{Results: histResults(res)})
	}
	return res, err
}

func (f *faultGen) items(q string, parts ...string) []queen.Item {
	items := make([]queen.Item, len(parts))
	for i, p := range parts {
		tx := fmt.Sprintf("%s/%d", q, i)
		items[i] = queen.Item{Partition: p, TransactionID: tx, Data: payload(q, tx)}
	}
	return items
}

func allStatus(res []queen.PushResult, s queen.PushStatus) bool {
	for _, r := range res {
		if r.Status != s {
			return false
		}
	}
	return len(res) > 0
}

// pop records a Pop of f.c; its BadData are the deliveries whose Data is
// not payload(queue, transaction id), as on the run's own queues.
func (f *faultGen) pop(ctx context.Context, q string, o queen.PopOptions) []*queen.Message {
	inv := f.r.rec.Invoke(history.Event{Proc: "faults", Op: history.OpPop, Queue: q, Group: o.Group, Batch: o.Batch})
	msgs, err := f.c.Queue(q).Pop(ctx, o)
	if err != nil {
		f.r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return nil
	}
	ds := make([]history.Delivery, len(msgs))
	var bad []history.Delivery
	for i, m := range msgs {
		ds[i] = delivery(m)
		if !m.ID.IsNil() && !bytes.Equal(m.Data, payload(q, m.TransactionID)) {
			bad = append(bad, ds[i])
		}
	}
	f.r.rec.Done(inv, history.OK, history.Event{Msgs: ds, BadData: bad})
	return msgs
}

// rewrite overwrites the segment at base 0 of q's partition with what
// mutate makes of its frames (false: leave it), and records it as a
// "rewrite" call: Msgs what each offset holds now, Unreadable those whose
// payload no longer opens.
func (f *faultGen) rewrite(ctx context.Context, q, part string, mutate func(fs []frame.Frame) (unreadable []int)) bool {
	conn, err := pgx.Connect(ctx, f.r.url())
	if err != nil {
		return false
	}
	defer conn.Close(context.Background())
	s := pgx.Identifier{f.r.schema}.Sanitize()
	var pid int64
	var blob []byte
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT s.partition_id, s.blob FROM %[1]s.segments s
		JOIN %[1]s.partitions p ON p.id = s.partition_id JOIN %[1]s.queues q ON q.id = p.queue_id
		WHERE q.name = $1 AND p.name = $2 AND s.base_offset = 0`, s), q, part).Scan(&pid, &blob)
	if err != nil {
		return false
	}
	raw, err := segment.Decompress(nil, blob)
	if err != nil {
		return false
	}
	fs, err := frame.DecodeAll(raw)
	if err != nil || len(fs) < 2 {
		return false
	}
	bad := mutate(fs)
	var out []byte
	ev := history.Event{Proc: "faults", Op: history.OpCall, Kind: "rewrite", Queue: q}
	for k := range fs {
		out = frame.Append(out, &fs[k])
		d := history.Delivery{Partition: part, Offset: int64(k), ID: fs[k].ID.String(), TxID: fs[k].TransactionID}
		ev.Msgs = append(ev.Msgs, d)
	}
	for _, k := range bad {
		ev.Unreadable = append(ev.Unreadable, ev.Msgs[k])
	}
	inv := f.r.rec.Invoke(ev)
	tag, err := conn.Exec(ctx, fmt.Sprintf(`UPDATE %s.segments SET blob = $3 WHERE partition_id = $1 AND base_offset = 0 AND blob = $2`, s),
		pid, blob, segment.Compress(nil, out))
	switch {
	case err != nil:
		f.r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
		return false
	case tag.RowsAffected() != 1:
		f.r.rec.Done(inv, history.Fail, history.Event{})
		return false
	}
	f.r.rec.Done(inv, history.OK, history.Event{})
	return true
}

// swap: two messages of an encrypted queue with each other's ciphertext.
// A payload is bound to its message: both are dead-lettered, neither is
// delivered (rewritten-read, corrupt-payload).
func (f *faultGen) swap(ctx context.Context) {
	q := f.name("swap")
	if err := f.c.Queue(q).Configure(ctx, queen.QueueOptions{Encryption: true, DeadLetter: true, RetryLimit: 1, LeaseTime: 2 * time.Second}); err != nil {
		return
	}
	if res, err := f.push(ctx, f.c, "faults", q, f.items(q, "p", "p", "p"), false); err != nil || !allStatus(res, queen.Queued) {
		return
	}
	if !f.rewrite(ctx, q, "p", func(fs []frame.Frame) []int {
		fs[0].Payload, fs[1].Payload = fs[1].Payload, fs[0].Payload
		return []int{0, 1}
	}) {
		return
	}
	ackAll(ctx, f.r.rec, "faults", f.c.Queue(q), f.pop(ctx, q, queen.PopOptions{Batch: 10, LeaseTime: 2 * time.Second}))
}

// cacheReplace: a client reads part of a segment, the segment is replaced
// under its key by other messages (a restore), and the same client reads
// the rest: what the segment holds now (rewritten-read).
func (f *faultGen) cacheReplace(ctx context.Context) {
	q := f.name("cache")
	if err := f.c.Queue(q).Configure(ctx, queen.QueueOptions{LeaseTime: 2 * time.Second}); err != nil {
		return
	}
	if res, err := f.push(ctx, f.c, "faults", q, f.items(q, "p", "p", "p", "p", "p", "p"), false); err != nil || !allStatus(res, queen.Queued) {
		return
	}
	// Two of six: the client keeps the segment for the rest.
	head := f.pop(ctx, q, queen.PopOptions{Batch: 2, LeaseTime: 2 * time.Second})
	if len(head) == 0 || ackAll(ctx, f.r.rec, "faults", f.c.Queue(q), head) != len(head) {
		return
	}
	if !f.rewrite(ctx, q, "p", func(fs []frame.Frame) []int {
		for k := range fs {
			fs[k].ID = uuid.Must(uuid.NewV4())
			fs[k].TransactionID += "'"
			fs[k].Payload = payload(q, fs[k].TransactionID)
		}
		return nil
	}) {
		return
	}
	ackAll(ctx, f.r.rec, "faults", f.c.Queue(q), f.pop(ctx, q, queen.PopOptions{Batch: 10, LeaseTime: 2 * time.Second}))
}

// corruptPop: one partition's segment of a three-partition pop is
// garbage. Its messages are dead-lettered alone; the rest is delivered, now
// and by every later pop (never-delivered on an audited queue).
func (f *faultGen) corruptPop(ctx context.Context) {
	q := f.name("corrupt")
	if err := f.c.Queue(q).Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, DeadLetter: true, RetryLimit: 2, LeaseTime: time.Second}); err != nil {
		return
	}
	f.r.addQueue(q, history.QueueInfo{Deduped: true, DeadLetter: true, Groups: []string{""}})
	if res, err := f.push(ctx, f.c, "faults", q, f.items(q, "p0", "p0", "p1", "p1", "p2", "p2"), false); err != nil || !allStatus(res, queen.Queued) {
		return
	}
	if f.r.destroy(ctx, q, "p0") != nil {
		return
	}
	ackAll(ctx, f.r.rec, "faults", f.c.Queue(q), f.pop(ctx, q, queen.PopOptions{Batch: 10, Partitions: 3, LeaseTime: time.Second}))
}

// destroy overwrites the segment at base 0 of q's partition with
// corruptBlob and remembers its messages as destroyed (as the nemesis's
// "corrupt" does on "pause").
func (r *run) destroy(ctx context.Context, q, part string) error {
	conn, err := pgx.Connect(ctx, r.url())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	s := pgx.Identifier{r.schema}.Sanitize()
	var pid int64
	var blob []byte
	var failures int
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT s.partition_id, s.blob, s.failures FROM %[1]s.segments s
		JOIN %[1]s.partitions p ON p.id = s.partition_id JOIN %[1]s.queues q ON q.id = p.queue_id
		WHERE q.name = $1 AND p.name = $2 AND s.base_offset = 0`, s), q, part).Scan(&pid, &blob, &failures)
	if err != nil {
		return err
	}
	raw, err := segment.Decompress(nil, blob)
	if err != nil {
		return err
	}
	var msgs []history.Stored
	if err := frame.Decode(raw, func(k int, fr *frame.Frame) error {
		msgs = append(msgs, history.Stored{Queue: q, Partition: part, Offset: int64(k), ID: fr.ID.String(), TxID: fr.TransactionID, Failures: failures})
		return nil
	}); err != nil {
		return err
	}
	// Before the write: one whose reply is lost may have happened.
	r.destroyMu.Lock()
	r.destroyed = append(r.destroyed, msgs...)
	r.destroyMu.Unlock()
	_, err = conn.Exec(ctx, fmt.Sprintf(`UPDATE %s.segments SET blob = $3 WHERE partition_id = $1 AND base_offset = 0 AND blob = $2`, s), pid, blob, corruptBlob)
	return err
}

// idlePurge: a transaction id pushed, read and acked (CompletedRetention
// then deletes it), its partition idle past a short IdlePartition and
// offered to the purge, the same id pushed again inside the dedup window:
// a Duplicate of the original, never stored twice (duplicated).
func (f *faultGen) idlePurge(ctx context.Context) {
	q := f.name("idle")
	if err := f.c.Queue(q).Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, CompletedRetention: time.Millisecond, LeaseTime: time.Second}); err != nil {
		return
	}
	f.r.addQueue(q, history.QueueInfo{Deduped: true, Completed: true, Groups: []string{""}})
	items := f.items(q, "p")
	if res, err := f.push(ctx, f.c, "faults", q, items, false); err != nil || !allStatus(res, queen.Queued) {
		return
	}
	if ackAll(ctx, f.r.rec, "faults", f.c.Queue(q), f.pop(ctx, q, queen.PopOptions{Batch: 1, LeaseTime: time.Second})) != 1 {
		return
	}
	conn, err := pgx.Connect(ctx, f.r.url())
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	s := pgx.Identifier{f.r.schema}.Sanitize()
	var pid int64
	if conn.QueryRow(ctx, fmt.Sprintf(`SELECT p.id FROM %[1]s.partitions p JOIN %[1]s.queues q ON q.id = p.queue_id
		WHERE q.name = $1 AND p.name = 'p'`, s), q).Scan(&pid) != nil {
		return
	}
	// The maintenance pass's own steps: completed retention empties the
	// partition, then the purge with an IdlePartition of 100 ms.
	for deadline := time.Now().Add(5 * time.Second); ; {
		var left int64
		if conn.QueryRow(ctx, fmt.Sprintf(`SELECT %[1]s.retention_step($1, 1000)::bigint, (SELECT count(*) FROM %[1]s.segments WHERE partition_id = $1)`, s),
			pid).Scan(new(int64), &left) != nil {
			return
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(150 * time.Millisecond)
	inv := f.r.rec.Invoke(history.Event{Proc: "faults", Op: history.OpCall, Kind: "purge", Queue: q, Partition: "p"})
	var purged bool
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT %s.purge_partition($1, 100)`, s), pid).Scan(&purged); err != nil {
		f.r.rec.Done(inv, history.Info, history.Event{Err: err.Error()})
	} else {
		f.r.rec.Done(inv, history.OK, history.Event{Err: fmt.Sprint("purged: ", purged)})
	}
	f.push(ctx, f.c, "faults", q, items, false)
}

// spool runs one round of the keyless client's spool faults.
func (f *faultGen) spool(ctx context.Context, k *queen.Client) {
	pois, nd, enc := f.name("poison"), f.name("spool"), f.name("enc")
	for _, qo := range []struct {
		q string
		o queen.QueueOptions
	}{{pois, queen.QueueOptions{DedupWindow: time.Hour}}, {nd, queen.QueueOptions{RetryLimit: 2}}, {enc, queen.QueueOptions{Encryption: true}}} {
		if err := f.admin.Queue(qo.q).Configure(ctx, qo.o); err != nil {
			return
		}
	}
	f.r.addQueue(nd, history.QueueInfo{Groups: []string{""}})
	const proc = "faults-nokey"
	// k learns which queues are plain and which encrypted (a push that
	// timed out, Buffered, fetched the settings all the same).
	if _, err := f.push(ctx, k, proc, pois, f.items(pois, "x"), false); err != nil {
		return
	}
	if _, err := f.push(ctx, k, proc, nd, f.items(nd+"/0", "a", "b"), false); err != nil {
		return
	}
	// Not invalid yet: a push whose settings read times out is spooled
	// when the queue was not encrypted at k's last look at the schema.
	if _, err := f.push(ctx, k, proc, enc, f.items(enc, "x"), false); !errors.Is(err, queen.ErrEncryption) {
		return
	}
	f.r.maintMu.RLock()
	defer f.r.maintMu.RUnlock()
	fault := f.r.rec.Invoke(history.Event{Proc: "faults", Op: history.OpFault, Kind: "maintenance"})
	f.r.faults.Add(1)
	if err := k.SetMaintenance(ctx, true); err != nil {
		f.r.rec.Done(fault, history.OK, history.Event{Err: err.Error()})
		return
	}
	// Spooled in this order: the poison record first, then a's, then b's.
	f.push(ctx, k, proc, pois, f.items(pois+"/1", "x"), false)
	f.push(ctx, k, proc, nd, f.items(nd+"/1", "a", "a"), false)
	f.push(ctx, k, proc, nd, f.items(nd+"/2", "b", "b"), false)
	f.push(ctx, k, proc, enc, f.items(enc+"/1", "x"), true)
	// Never replayable: k has no key for it now.
	_ = f.admin.Queue(pois).Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, Encryption: true})
	release := f.lock(ctx, nd, "a")
	defer release()
	for ctx.Err() == nil {
		if err := k.SetMaintenance(context.WithoutCancel(ctx), false); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.r.rec.Done(fault, history.OK, history.Event{})
	if ctx.Err() != nil {
		// The step's time ran out while maintenance mode would not end: a
		// push now would fail for its dead context, not for the database.
		return
	}
	// Spooled behind a's records (not overtaking them) while the poison
	// record still fails: not yet tried when it is quarantined.
	f.push(ctx, k, proc, nd, f.items(nd+"/3", "a", "a"), false)
	// a stays locked until the poison record is quarantined (three failed
	// passes), then drains.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st := k.SpoolStats(); st.QuarantinedRecords > 0 || st.QuarantinedFiles > 0 || st.PendingRecords == 0 {
			break
		}
	}
	release()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && k.SpoolStats().PendingRecords > 0; {
		time.Sleep(50 * time.Millisecond)
	}
}

// lock holds q's partition row past every statement timeout until the
// returned func is called (at most faultsStep).
func (f *faultGen) lock(ctx context.Context, q, part string) (release func()) {
	conn, err := pgx.Connect(ctx, f.r.url())
	if err != nil {
		return func() {}
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %[1]s.partitions p JOIN %[1]s.queues q ON q.id = p.queue_id
			WHERE q.name = $1 AND p.name = $2 FOR NO KEY UPDATE OF p`, pgx.Identifier{f.r.schema}.Sanitize()), q, part)
	}
	if err != nil {
		conn.Close(context.Background())
		return func() {}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = tx.Rollback(context.Background())
			conn.Close(context.Background())
		})
	}
}

// keyedCorrupt: a per-key Consume settles offset 1 of a segment out of
// order (key B) and fails offset 0 (key A, which holds 2 and 3 back); then
// the segment is corrupted. The undecodable run 0, 2, 3 around the settled
// offset is dead-lettered at once and the message pushed after it is
// delivered (never-delivered), not held behind the run's lease.
func (f *faultGen) keyedCorrupt(ctx context.Context) {
	q := f.name("keyed")
	if err := f.c.Queue(q).Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, DeadLetter: true, RetryLimit: 3, LeaseTime: 2 * time.Second}); err != nil {
		return
	}
	f.r.addQueue(q, history.QueueInfo{Deduped: true, DeadLetter: true, Groups: []string{""}})
	items := f.items(q, "p", "p", "p", "p")
	for i, k := range []string{"A", "B", "A", "A"} {
		items[i].Key = k
	}
	if res, err := f.push(ctx, f.c, "faults", q, items, false); err != nil || !allStatus(res, queen.Queued) {
		return
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ran atomic.Int32
	o := queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 4, LeaseTime: 2 * time.Second, Wait: 200 * time.Millisecond}, KeyConcurrency: 2}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.c.Queue(q).Consume(cctx, o, func(_ context.Context, m *queen.Message) error {
			inv := f.r.rec.Invoke(history.Event{Proc: "faults", Op: history.OpHandler, Queue: q, Group: m.Group,
				Partition: m.Partition, Offset: m.Offset, Lease: m.LeaseID, Msgs: []history.Delivery{delivery(m)}})
			var err error
			if m.Key == "A" {
				err = errors.New("history: handler failed on purpose")
			}
			f.r.rec.Done(inv, history.OK, history.Event{Err: errText(err)})
			if ran.Add(1) == 2 {
				// The batch's settlement is written once both returned.
				time.AfterFunc(100*time.Millisecond, cancel)
			}
			return err
		})
	}()
	select {
	case <-done:
	case <-time.After(faultsStep):
		return
	}
	if ran.Load() < 2 || f.r.destroy(ctx, q, "p") != nil {
		return
	}
	tail := f.items(q+"/tail", "p")
	if res, err := f.push(ctx, f.c, "faults", q, tail, false); err != nil || !allStatus(res, queen.Queued) {
		return
	}
	ackAll(ctx, f.r.rec, "faults", f.c.Queue(q), f.pop(ctx, q, queen.PopOptions{Batch: 10, LeaseTime: 2 * time.Second}))
}

// hasty pushes one item at a time through a client whose statements time
// out after a millisecond: each is spooled, and its spool write outlasts
// that deadline now and then. Three rounds a run are plenty.
func (f *faultGen) hasty(ctx context.Context, c *queen.Client) {
	if f.hastyRounds.Add(1) > 3 {
		time.Sleep(100 * time.Millisecond)
		return
	}
	q := f.name("hasty")
	if err := f.c.Queue(q).Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		return
	}
	f.r.addQueue(q, history.QueueInfo{Deduped: true, Groups: []string{""}})
	for i := range 10 {
		f.push(ctx, c, "faults-hasty", q, f.items(fmt.Sprintf("%s/%d", q, i), "p"), false)
	}
}
