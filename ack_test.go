package queen_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// short lease for expiry tests; pops after it use waitLease.
const shortLease = time.Second

func waitLease() { time.Sleep(shortLease + 150*time.Millisecond) }

func deadLetters(t testing.TB, q *queen.Queue) []queen.DeadLetter {
	t.Helper()
	dl, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil {
		t.Fatal(err)
	}
	return dl
}

// Pop 5, ack only the 5th: the ack commits through it, so nothing comes
// back after the lease.
func TestAckCommitsThrough(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: shortLease})
	pushN(t, q, "", "m", 6)
	msgs := pop(t, q, queen.PopOptions{Batch: 5})
	wantData(t, msgs, "m0", "m1", "m2", "m3", "m4")
	ack(t, msgs[4])
	waitLease()
	wantData(t, pop(t, q, queen.PopOptions{Batch: 10}), "m5")
	// Acks below the cursor are a reported no-op.
	if err := msgs[1].Ack(ctxT(t)); !errors.Is(err, queen.ErrAlreadyAcked) {
		t.Fatalf("ack below the cursor = %v, want ErrAlreadyAcked", err)
	}
}

// Acking a message in the middle keeps the lease on the rest.
func TestAckPartialKeepsLease(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "", "m", 3)
	msgs := pop(t, q, queen.PopOptions{Batch: 3})
	ack(t, msgs[0])
	if got := pop(t, q, queen.PopOptions{Batch: 3}); len(got) != 0 {
		t.Fatalf("the rest of a partly acked lease was popped again: %q", datas(got))
	}
	ack(t, msgs[2])
	if err := msgs[1].Ack(ctxT(t)); !errors.Is(err, queen.ErrAlreadyAcked) {
		t.Fatalf("ack of an earlier message after a later one = %v", err)
	}
}

// An ack call [ok, fail, ok, ok, ok] stops the cursor below the failure:
// messages 2..5 are redelivered.
func TestAckBatchMixed(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 5, RetryBackoff: noBackoff})
	pushN(t, q, "", "m", 5)
	msgs := pop(t, q, queen.PopOptions{Batch: 5})
	reqs := make([]queen.AckRequest, 5)
	for i, m := range msgs {
		reqs[i] = queen.AckRequest{Message: m}
	}
	reqs[1].Status, reqs[1].Reason = queen.AckFail, errors.New("boom")
	// Input order must not matter: the batch is taken in offset order.
	reqs[0], reqs[4] = reqs[4], reqs[0]
	errs, err := q.AckBatch(ctxT(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	want := []error{queen.ErrAckSkipped, nil, queen.ErrAckSkipped, queen.ErrAckSkipped, nil}
	for i := range want {
		if !errors.Is(errs[i], want[i]) || (want[i] == nil && errs[i] != nil) {
			t.Fatalf("verdicts %v, want %v", errs, want)
		}
	}
	again := pop(t, q, queen.PopOptions{Batch: 10})
	wantData(t, again, "m1", "m2", "m3", "m4")
	if again[0].Attempt != 2 {
		t.Fatalf("redelivered message has Attempt %d, want 2", again[0].Attempt)
	}
	if len(deadLetters(t, q)) != 0 {
		t.Fatal("a failure under the budget was dead-lettered")
	}
}

func TestAckBatchAllOK(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "a", "a", 2)
	pushN(t, q, "b", "b", 2)
	msgs := pop(t, q, queen.PopOptions{Batch: 4, Partitions: 2})
	if len(msgs) < 4 && onLayout() {
		// A claim there takes one worker's partitions: a and b may lie on two.
		msgs = append(msgs, pop(t, q, queen.PopOptions{Batch: 4, Partitions: 2})...)
	}
	if len(msgs) != 4 {
		t.Fatalf("popped %q, want a's and b's", datas(msgs))
	}
	var reqs []queen.AckRequest
	for _, m := range msgs {
		reqs = append(reqs, queen.AckRequest{Message: m})
	}
	errs, err := q.AckBatch(ctxT(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("request %d: %v", i, e)
		}
	}
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		if len(p.Groups) != 1 || p.Groups[0].Committed != 1 || p.Groups[0].Leased {
			t.Fatalf("status after ack: %+v", p)
		}
	}
}

// Fail redelivers from the failed message; earlier ones of the lease are done.
func TestFailRedeliversFromFailed(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryBackoff: noBackoff})
	pushN(t, q, "", "m", 3)
	msgs := pop(t, q, queen.PopOptions{Batch: 3})
	if err := msgs[1].Fail(ctxT(t), errors.New("x")); err != nil {
		t.Fatal(err)
	}
	if err := msgs[2].Ack(ctxT(t)); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("ack after the lease was released = %v, want ErrLeaseLost", err)
	}
	again := pop(t, q, queen.PopOptions{Batch: 3})
	wantData(t, again, "m1", "m2")
	if again[0].Attempt != 2 {
		t.Fatalf("Attempt = %d, want 2", again[0].Attempt)
	}
}

// Six retries charge nothing: no dead letter, and the message still comes.
func TestRetryDoesNotCharge(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 3, DeadLetter: true})
	pushN(t, q, "", "m", 2)
	for i := 0; i < 6; i++ {
		msgs := pop(t, q, queen.PopOptions{})
		wantData(t, msgs, "m0")
		if msgs[0].Attempt != i+1 {
			t.Fatalf("retry %d: Attempt %d", i, msgs[0].Attempt)
		}
		if err := msgs[0].Retry(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	if dl := deadLetters(t, q); len(dl) != 0 {
		t.Fatalf("retries dead-lettered: %+v", dl)
	}
	msgs := pop(t, q, queen.PopOptions{})
	wantData(t, msgs, "m0")
	ack(t, msgs[0])
	wantData(t, pop(t, q, queen.PopOptions{}), "m1")
}

// RetryLimit failures produce exactly one dead letter holding the payload,
// and the cursor moves past it.
func TestFailDeadLettersAtLimit(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 3, DeadLetter: true, RetryBackoff: noBackoff})
	res := pushN(t, q, "p", "m", 2)
	for i := 1; i <= 3; i++ {
		msgs := pop(t, q, queen.PopOptions{})
		wantData(t, msgs, "m0")
		if i < 3 && len(deadLetters(t, q)) != 0 {
			t.Fatalf("dead-lettered after %d failures", i-1)
		}
		if err := msgs[0].Fail(ctxT(t), fmt.Errorf("failure %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	dl := deadLetters(t, q)
	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	d := dl[0]
	if string(d.Data) != "m0" || d.MessageID != res[0].MessageID || d.TransactionID != res[0].TransactionID ||
		d.Partition != "p" || d.Group != "" || d.Offset != 0 || d.Attempts != 3 || d.Reason != "failure 3" ||
		!d.CreatedAt.Equal(res[0].CreatedAt) || d.Queue != "q" {
		t.Fatalf("dead letter %+v", d)
	}
	wantData(t, pop(t, q, queen.PopOptions{}), "m1")
}

// Without DeadLetter an exhausted message is dropped.
func TestFailDropsWithoutDeadLetterStore(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: -1})
	pushN(t, q, "", "m", 2)
	msgs := pop(t, q, queen.PopOptions{})
	if err := msgs[0].Fail(ctxT(t), nil); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, c, "dead_letters"); n != 0 {
		t.Fatalf("%d dead letters on a queue without the store", n)
	}
	wantData(t, pop(t, q, queen.PopOptions{}), "m1")
}

// Four lease expiries charge nothing; an ack after expiry is ErrLeaseLost.
func TestLeaseExpiryDoesNotCharge(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 3, DeadLetter: true, LeaseTime: time.Hour, RetryBackoff: noBackoff})
	pushN(t, q, "", "m", 1)
	var last *queen.Message
	for i := 1; i <= 4; i++ {
		// The per-pop LeaseTime overrides the queue's hour.
		msgs := pop(t, q, queen.PopOptions{LeaseTime: 300 * time.Millisecond})
		wantData(t, msgs, "m0")
		if msgs[0].Attempt != i {
			t.Fatalf("expiry %d: Attempt %d", i, msgs[0].Attempt)
		}
		last = msgs[0]
		time.Sleep(400 * time.Millisecond)
	}
	if err := last.Ack(ctxT(t)); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("ack after expiry = %v, want ErrLeaseLost", err)
	}
	if dl := deadLetters(t, q); len(dl) != 0 {
		t.Fatalf("lease expiries dead-lettered: %+v", dl)
	}
	msgs := pop(t, q, queen.PopOptions{})
	wantData(t, msgs, "m0")
	// The budget is whole: three failures are needed to dead-letter.
	for i := 0; i < 3; i++ {
		if i > 0 {
			msgs = pop(t, q, queen.PopOptions{})
		}
		if err := msgs[0].Fail(ctxT(t), nil); err != nil {
			t.Fatal(err)
		}
		if n := len(deadLetters(t, q)); n != map[bool]int{true: 1, false: 0}[i == 2] {
			t.Fatalf("after %d failures: %d dead letters", i+1, n)
		}
	}
}

// A lease taken over by another consumer: the old holder's ack is lost.
func TestAckLeaseTakenOver(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "", "m", 1)
	old := pop(t, q, queen.PopOptions{LeaseTime: 200 * time.Millisecond})
	time.Sleep(300 * time.Millisecond)
	cur := pop(t, q, queen.PopOptions{})
	wantData(t, cur, "m0")
	if err := old[0].Ack(ctxT(t)); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("old holder's ack = %v, want ErrLeaseLost", err)
	}
	ack(t, cur[0])
}

func TestDeadLetterExplicit(t *testing.T) {
	c := open(t)
	q := c.Queue("q") // DeadLetter false: explicit dead letters are still kept
	pushN(t, q, "", "m", 3)
	msgs := pop(t, q, queen.PopOptions{Batch: 3})
	if err := msgs[0].DeadLetter(ctxT(t), errors.New("poison")); err != nil {
		t.Fatal(err)
	}
	// The rest of the lease stays owned.
	if got := pop(t, q, queen.PopOptions{Batch: 3}); len(got) != 0 {
		t.Fatalf("popped %q while leased", datas(got))
	}
	ack(t, msgs[2])
	dl := deadLetters(t, q)
	if len(dl) != 1 || string(dl[0].Data) != "m0" || dl[0].Reason != "poison" || dl[0].Attempts != 0 {
		t.Fatalf("dead letters %+v", dl)
	}
}

func TestExtendLease(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	// On the layout a pop and the ExtendLease after it take several
	// coordinator round trips: the same steps, on a slower clock.
	scale := time.Duration(1)
	if onLayout() {
		scale = 5
	}
	pushN(t, q, "", "m", 1)
	msgs := pop(t, q, queen.PopOptions{LeaseTime: 300 * time.Millisecond * scale})
	before := msgs[0].LeaseExpiresAt
	if err := msgs[0].ExtendLease(ctxT(t), 2*time.Second*scale); err != nil {
		t.Fatal(err)
	}
	if !msgs[0].LeaseExpiresAt.After(before) {
		t.Fatalf("LeaseExpiresAt not moved: %v -> %v", before, msgs[0].LeaseExpiresAt)
	}
	time.Sleep(500 * time.Millisecond * scale)
	if got := pop(t, q, queen.PopOptions{}); len(got) != 0 {
		t.Fatal("an extended lease was taken over")
	}
	ack(t, msgs[0])

	pushN(t, q, "", "n", 1)
	msgs = pop(t, q, queen.PopOptions{LeaseTime: 100 * time.Millisecond * scale})
	time.Sleep(200 * time.Millisecond * scale)
	if err := msgs[0].ExtendLease(ctxT(t), time.Second); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("ExtendLease after expiry = %v, want ErrLeaseLost", err)
	}
}

func TestAckAfterQueueDeleted(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "", "m", 1)
	msgs := pop(t, q, queen.PopOptions{})
	if err := q.Delete(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := msgs[0].Ack(ctxT(t)); !errors.Is(err, queen.ErrUnknownMessage) {
		t.Fatalf("ack after delete = %v, want ErrUnknownMessage", err)
	}
	var zero queen.Message
	if err := zero.Ack(ctxT(t)); !errors.Is(err, queen.ErrUnknownMessage) {
		t.Fatalf("ack of a zero Message = %v", err)
	}
}

// Groups settle independently: a group's failure does not touch another's.
func TestAckGroupsIndependent(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "", "m", 2)
	a := pop(t, q, queen.PopOptions{Group: "a", Batch: 2})
	b := pop(t, q, queen.PopOptions{Group: "b", Batch: 2})
	ack(t, a[1])
	if err := b[0].Retry(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	wantData(t, pop(t, q, queen.PopOptions{Group: "a", Batch: 2}))
	wantData(t, pop(t, q, queen.PopOptions{Group: "b", Batch: 2}), "m0", "m1")
}

// Acks from many consumers at once share transactions, and each caller
// still gets its own verdict: applied, already acked, or lease lost, mixed
// in the same flushes.
func TestAckFusionVerdicts(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	const parts = 40
	leases := make([][]*queen.Message, parts)
	for p := range parts {
		name := fmt.Sprintf("p%02d", p)
		pushN(t, q, name, "m", 3)
		o := queen.PopOptions{Partition: name, Batch: 3}
		if p >= 35 {
			o.LeaseTime = 50 * time.Millisecond
		}
		leases[p] = pop(t, q, o)
		if len(leases[p]) != 3 {
			t.Fatalf("partition %s: popped %d", name, len(leases[p]))
		}
	}
	// 30..34: already acked through the end; 35..39: lease expired and
	// taken over by another pop.
	for p := 30; p < 35; p++ {
		ack(t, leases[p][2])
	}
	time.Sleep(100 * time.Millisecond)
	for p := 35; p < parts; p++ {
		if got := pop(t, q, queen.PopOptions{Partition: fmt.Sprintf("p%02d", p), Batch: 3}); len(got) != 3 {
			t.Fatalf("take-over pop of p%02d got %d", p, len(got))
		}
	}

	before := c.Stats()
	errs := make([]error, parts)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for p := range parts {
		wg.Go(func() {
			<-start
			m := leases[p][2]
			if p >= 30 && p < 35 {
				m = leases[p][1]
			}
			errs[p] = m.Ack(ctxT(t))
		})
	}
	close(start)
	wg.Wait()
	after := c.Stats()

	for p, err := range errs {
		var want error
		switch {
		case p >= 35:
			want = queen.ErrLeaseLost
		case p >= 30:
			want = queen.ErrAlreadyAcked
		}
		if !errors.Is(err, want) {
			t.Fatalf("ack on p%02d = %v, want %v", p, err, want)
		}
	}
	if acks := after.Acks - before.Acks; acks != parts {
		t.Fatalf("Stats counted %d acks, want %d", acks, parts)
	}
	if commits := after.AckCommits - before.AckCommits; commits >= parts {
		t.Fatalf("%d concurrent acks took %d flushes: nothing was fused", parts, commits)
	}
	// The applied acks committed: their partitions have nothing left.
	for p := range 30 {
		if got := pop(t, q, queen.PopOptions{Partition: fmt.Sprintf("p%02d", p), Batch: 10}); len(got) != 0 {
			t.Fatalf("p%02d redelivered %q after its ack", p, datas(got))
		}
	}
}

// A nil *Message is bad input: every settling method, Client.Tx's Ack and
// Fail, and AckBatch report ErrUnknownMessage instead of panicking.
func TestNilMessageSettlesWithError(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	ctx := ctxT(t)
	var m *queen.Message
	calls := map[string]func() error{
		"Ack":         func() error { return m.Ack(ctx) },
		"Fail":        func() error { return m.Fail(ctx, errors.New("x")) },
		"Retry":       func() error { return m.Retry(ctx) },
		"DeadLetter":  func() error { return m.DeadLetter(ctx, errors.New("x")) },
		"ExtendLease": func() error { return m.ExtendLease(ctx, time.Second) },
		"Tx.Ack":      func() error { return c.Tx(ctx, func(tx *queen.Tx) error { tx.Ack(m); return nil }) },
		"Tx.Fail":     func() error { return c.Tx(ctx, func(tx *queen.Tx) error { tx.Fail(m, nil); return nil }) },
	}
	for name, call := range calls {
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			err = call()
		}()
		if !errors.Is(err, queen.ErrUnknownMessage) {
			t.Errorf("%s on a nil message = %v, want ErrUnknownMessage", name, err)
		}
	}
	pushN(t, q, "", "m", 1)
	live := pop(t, q, queen.PopOptions{})
	errs, err := q.AckBatch(ctx, []queen.AckRequest{{Message: nil}, {Message: live[0]}, {Message: nil, Status: queen.AckFail}})
	if err != nil || len(errs) != 3 || !errors.Is(errs[0], queen.ErrUnknownMessage) || errs[1] != nil ||
		!errors.Is(errs[2], queen.ErrUnknownMessage) {
		t.Fatalf("AckBatch with nil entries = %v, %v", errs, err)
	}
}

// A lease under a millisecond must still exclude: Configure refuses a
// queue LeaseTime it would store as 0 (a lease that is over when it starts,
// so two pops share the partition and no ack applies), and Pop rounds its
// own LeaseTime up to a millisecond.
func TestSubMillisecondLeaseTime(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("q")
	err := q.Configure(ctx, queen.QueueOptions{LeaseTime: 500 * time.Microsecond})
	if err == nil {
		pushN(t, q, "", "m", 1)
		first := pop(t, q, queen.PopOptions{})
		second := pop(t, q, queen.PopOptions{})
		t.Fatalf("Configure accepted a 500µs LeaseTime; two pops got %q and %q, first ack: %v",
			datas(first), datas(second), first[0].Ack(ctx))
	}
	if !strings.Contains(err.Error(), "LeaseTime") {
		t.Fatalf("Configure error %q does not name LeaseTime", err)
	}
	if n := countRows(t, c, "queues"); n != 0 {
		t.Fatalf("a rejected Configure created %d queues", n)
	}

	pushN(t, q, "", "m", 1)
	msgs := pop(t, q, queen.PopOptions{LeaseTime: 500 * time.Microsecond})
	var leaseMs float64
	if err := c.Pool().QueryRow(ctx, "SELECT extract(epoch FROM lease_expires_at - updated_at) * 1000 FROM "+
		pgx.Identifier{c.Schema(), "consumers"}.Sanitize()).Scan(&leaseMs); err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || leaseMs < 1 {
		t.Fatalf("a 500µs pop lease is stored as %vms (popped %q), want at least 1ms", leaseMs, datas(msgs))
	}
}

// A transaction id PostgreSQL text cannot hold (invalid UTF-8, NUL) could be
// pushed but never settled: Fail, Retry and DeadLetter send it back as
// text. Push rejects it up front, writing nothing.
func TestUnsettleableTransactionIDRejectedAtPush(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	for _, txn := range []string{"bad\xff", "nul\x00"} {
		res, err := q.Push(ctx, []queen.Item{{Data: []byte("ok")}, {Data: []byte("m"), TransactionID: txn}})
		if err == nil {
			msgs := pop(t, q, queen.PopOptions{Batch: 10})
			t.Fatalf("Push of transaction id %q = %+v; its Fail then = %v", txn, res, msgs[len(msgs)-1].Fail(ctx, nil))
		}
		if !errors.Is(err, queen.ErrInvalidName) || res != nil {
			t.Fatalf("Push of transaction id %q = %v, %v; want ErrInvalidName", txn, res, err)
		}
	}
	if n := countRows(t, c, "segments"); n != 0 {
		t.Fatalf("rejected pushes stored %d segments", n)
	}
}

// A reason is stored as valid text whatever the error says: invalid UTF-8
// replaced, NUL removed, length capped. Before, such a Fail could never
// apply and Consume redelivered the message forever.
func TestFailReasonSanitized(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true, RetryLimit: -1})
	pushN(t, q, "", "m", 3)
	msgs := pop(t, q, queen.PopOptions{Batch: 3})
	if err := msgs[0].Fail(ctx, errors.New("bad \xff utf8 and \x00 nul")); err != nil {
		t.Fatalf("Fail with an invalid reason: %v", err)
	}
	msgs = pop(t, q, queen.PopOptions{Batch: 2})
	if err := msgs[0].DeadLetter(ctx, errors.New(strings.Repeat("long ", 100_000))); err != nil {
		t.Fatalf("DeadLetter with a 500kB reason: %v", err)
	}
	errs, err := q.AckBatch(ctx, []queen.AckRequest{{Message: msgs[1], Status: queen.AckDeadLetter, Reason: errors.New("\x00")}})
	if err != nil || errs[0] != nil {
		t.Fatalf("AckBatch with a NUL reason: %v, %v", errs, err)
	}
	dl := deadLetters(t, q)
	if len(dl) != 3 {
		t.Fatalf("%d dead letters, want 3", len(dl))
	}
	if want := "bad \uFFFD utf8 and  nul"; dl[0].Reason != want {
		t.Errorf("reason %q, want %q", dl[0].Reason, want)
	}
	if r := dl[1].Reason; len(r) != queen.MaxReasonLen || !strings.HasPrefix(r, "long long") {
		t.Errorf("long reason stored as %d bytes, want its first MaxReasonLen (%d)", len(r), queen.MaxReasonLen)
	}
	if dl[2].Reason != "" {
		t.Errorf("NUL reason stored as %q", dl[2].Reason)
	}
}

// Settlements fused into one flush share statements: one that PostgreSQL
// rejects must not fail the others. Here consumers of four partitions
// settle in one flush: a Fail with a reason that is not text, a Fail of a
// message whose TransactionID its handler overwrote with a NUL (not
// sanitized: it is the stored message's identity), a Retry and an Ack.
func TestBadSettlementDoesNotFailOthersInFlush(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true, RetryLimit: -1})
	var msgs []*queen.Message
	for _, p := range []string{"a", "b", "c", "d"} {
		pushN(t, q, p, p, 2)
		msgs = append(msgs, pop(t, q, queen.PopOptions{Partition: p})...)
	}
	msgs[1].TransactionID = "handler\x00changed"
	errs := queen.SettleInOneFlush(c, msgs,
		[]queen.AckStatus{queen.AckFail, queen.AckFail, queen.AckRetry, queen.AckSuccess},
		[]error{errors.New("\xff\x00"), nil, nil, nil})
	if errs[0] != nil || errs[2] != nil || errs[3] != nil {
		t.Fatalf("verdicts %v: a bad settlement failed the others of its flush", errs)
	}
	if errs[1] == nil {
		t.Fatalf("a Fail with a NUL transaction id applied")
	}
	// The applied ones committed; the rejected one changed nothing.
	wantData(t, pop(t, q, queen.PopOptions{Partition: "a"}), "a1")
	wantData(t, pop(t, q, queen.PopOptions{Partition: "c"}), "c0")
	wantData(t, pop(t, q, queen.PopOptions{Partition: "d"}), "d1")
	if dl := deadLetters(t, q); len(dl) != 1 || dl[0].Partition != "a" {
		t.Fatalf("dead letters %+v, want a0's only", dl)
	}
}
