package queen_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// pushEach pushes n messages to partition, one push each (so each has its
// own created_at), and returns their offsets.
func pushEach(t testing.TB, q *queen.Queue, partition string, n int) {
	t.Helper()
	for i := range n {
		push(t, q, queen.Item{Partition: partition, Data: fmt.Appendf(nil, "%s-%d", partition, i)})
	}
}

// offsetsOf pops everything available for group on partition (one lease)
// and returns the offsets, acking them when ack.
func popOffsets(t testing.TB, q *queen.Queue, group, partition string, ack bool) []int64 {
	t.Helper()
	msgs := pop(t, q, queen.PopOptions{Group: group, Partition: partition, Batch: 1000})
	var out []int64
	for _, m := range msgs {
		out = append(out, m.Offset)
	}
	if ack && len(msgs) > 0 {
		if err := msgs[len(msgs)-1].Ack(ctxT(t)); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	return out
}

func gstat(t testing.TB, q *queen.Queue, group, partition string) (queen.GroupStatus, bool) {
	t.Helper()
	for _, p := range status(t, q).Partitions {
		if p.Name != partition {
			continue
		}
		for _, g := range p.Groups {
			if g.Group == group {
				return g, true
			}
		}
	}
	return queen.GroupStatus{}, false
}

func TestResetGroupTargets(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("reset")
	pushEach(t, q, "a", 6)
	pushEach(t, q, "b", 2)
	if got := popOffsets(t, q, "g", "a", true); len(got) != 6 {
		t.Fatalf("first read of a: %v", got)
	}

	mv, err := q.ResetGroup(ctx, "g", queen.ResetEarliest(), queen.ResetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// a had a cursor at 5; b had none yet (the group never popped there):
	// created where the subscription (all) starts it.
	want := []queen.OffsetMove{{Partition: "a", Before: 5, After: -1}, {Partition: "b", Before: -1, After: -1, Created: true}}
	if fmt.Sprint(mv) != fmt.Sprint(want) {
		t.Fatalf("earliest: %+v; want %+v", mv, want)
	}
	if got := popOffsets(t, q, "g", "a", false); fmt.Sprint(got) != "[0 1 2 3 4 5]" {
		t.Fatalf("after earliest: %v", got)
	}
	// The lease just taken makes the group active.
	if _, err := q.ResetGroup(ctx, "g", queen.ResetLatest(), queen.ResetOptions{}); !errors.Is(err, queen.ErrGroupActive) {
		t.Fatalf("reset with a live lease: %v; want ErrGroupActive", err)
	}
	if _, err := q.DeleteGroup(ctx, "g", queen.DeleteGroupOptions{}); !errors.Is(err, queen.ErrGroupActive) {
		t.Fatalf("delete with a live lease: %v; want ErrGroupActive", err)
	}
	released, err := q.ReleaseLease(ctx, "g", "a")
	if err != nil || !released {
		t.Fatalf("ReleaseLease: %v, %v", released, err)
	}
	if released, err := q.ReleaseLease(ctx, "g", "a"); err != nil || released {
		t.Fatalf("second ReleaseLease: %v, %v; want false", released, err)
	}

	mv, err = q.ResetGroup(ctx, "g", queen.ResetLatest(), queen.ResetOptions{})
	if err != nil || len(mv) != 2 || mv[0].After != 5 || mv[1].After != 1 {
		t.Fatalf("latest: %+v, %v", mv, err)
	}
	if got := popOffsets(t, q, "g", "", false); len(got) != 0 {
		t.Fatalf("after latest: %v", got)
	}
	push(t, q, queen.Item{Partition: "a"})
	if got := popOffsets(t, q, "g", "a", true); fmt.Sprint(got) != "[6]" {
		t.Fatalf("after latest and a push: %v", got)
	}

	// Exact offsets, only the named partition; past the head clamps to
	// the head.
	mv, err = q.ResetGroup(ctx, "g", queen.ResetToOffsets(map[string]int64{"a": 3}), queen.ResetOptions{})
	if err != nil || len(mv) != 1 || mv[0] != (queen.OffsetMove{Partition: "a", Before: 6, After: 2}) {
		t.Fatalf("offsets a=3: %+v, %v", mv, err)
	}
	if got := popOffsets(t, q, "g", "a", true); fmt.Sprint(got) != "[3 4 5 6]" {
		t.Fatalf("after offsets a=3: %v", got)
	}
	mv, err = q.ResetGroup(ctx, "g", queen.ResetToOffsets(map[string]int64{"a": 100, "b": 0}), queen.ResetOptions{})
	if err != nil || len(mv) != 2 || mv[0].After != 6 || mv[1].After != -1 {
		t.Fatalf("offsets a=100 b=0: %+v, %v", mv, err)
	}

	// By time: the first message stored at or after t.
	msgs := pop(t, q, queen.PopOptions{Group: "other", Partition: "a", Batch: 100, AutoAck: true})
	if len(msgs) != 7 {
		t.Fatalf("other read %d", len(msgs))
	}
	mv, err = q.ResetGroup(ctx, "g", queen.ResetToTime(msgs[4].CreatedAt), queen.ResetOptions{Partitions: []string{"a"}})
	if err != nil || len(mv) != 1 || mv[0].After != 3 {
		t.Fatalf("time of offset 4: %+v, %v", mv, err)
	}
	if got := popOffsets(t, q, "g", "a", true); fmt.Sprint(got) != "[4 5 6]" {
		t.Fatalf("after time: %v", got)
	}
	mv, err = q.ResetGroup(ctx, "g", queen.ResetToTime(time.Now().Add(time.Hour)), queen.ResetOptions{Partitions: []string{"a"}})
	if err != nil || len(mv) != 1 || mv[0].After != 6 {
		t.Fatalf("time in the future: %+v, %v", mv, err)
	}
	mv, err = q.ResetGroup(ctx, "g", queen.ResetToTime(time.Unix(0, 0)), queen.ResetOptions{Partitions: []string{"a"}})
	if err != nil || len(mv) != 1 || mv[0].After != -1 {
		t.Fatalf("time in the past: %+v, %v", mv, err)
	}

	// Another group is untouched throughout.
	if g, ok := gstat(t, q, "other", "a"); !ok || g.Committed != 6 {
		t.Fatalf("other group: %+v", g)
	}
}

func TestResetGroupSubscribesNewGroup(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("resetnew")
	pushEach(t, q, "a", 3)
	mv, err := q.ResetGroup(ctx, "fresh", queen.ResetLatest(), queen.ResetOptions{})
	if err != nil || len(mv) != 1 || !mv[0].Created || mv[0].After != 2 {
		t.Fatalf("latest of a new group: %+v, %v", mv, err)
	}
	// The first pop does not start it over: it is subscribed.
	if got := popOffsets(t, q, "fresh", "", false); len(got) != 0 {
		t.Fatalf("after latest: %v", got)
	}
	pushEach(t, q, "a", 1)
	pushEach(t, q, "z", 1) // a partition created after the reset
	// Pops to the first empty one: on the Citus layout a claim takes one
	// worker's partitions, and a and z may lie on two.
	n := 0
	for {
		got := pop(t, q, queen.PopOptions{Group: "fresh", Batch: 10, Partitions: 2, AutoAck: true})
		if len(got) == 0 {
			break
		}
		n += len(got)
	}
	if n != 2 {
		t.Fatalf("new messages: %d", n)
	}
	qs, err := c.Queues(ctx)
	if err != nil || len(qs) != 1 || len(qs[0].Groups) != 1 || qs[0].Groups[0].Group != "fresh" {
		t.Fatalf("Queues: %+v, %v", qs, err)
	}
}

func TestResetGroupClearsRetryWaitAndFailures(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("resetretry")
	if err := q.Configure(ctx, queen.QueueOptions{RetryLimit: 5,
		RetryBackoff: queen.RetryBackoff{Min: time.Hour, Max: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	pushEach(t, q, "a", 2)
	msgs := pop(t, q, queen.PopOptions{Group: "g", Partition: "a"})
	if err := msgs[0].Fail(ctx, errors.New("down")); err != nil {
		t.Fatal(err)
	}
	g, _ := gstat(t, q, "g", "a")
	if g.RetryAt.IsZero() || g.Failures != 1 {
		t.Fatalf("after the failure: %+v", g)
	}
	if got := popOffsets(t, q, "g", "a", false); len(got) != 0 {
		t.Fatalf("delivered during the wait: %v", got)
	}
	if _, err := q.ResetGroup(ctx, "g", queen.ResetEarliest(), queen.ResetOptions{}); err != nil {
		t.Fatal(err)
	}
	g, _ = gstat(t, q, "g", "a")
	if !g.RetryAt.IsZero() || g.Failures != 0 || g.Committed != -1 {
		t.Fatalf("after the reset: %+v", g)
	}
	msgs = pop(t, q, queen.PopOptions{Group: "g", Partition: "a"})
	if len(msgs) != 1 || msgs[0].Offset != 0 || msgs[0].Attempt != 1 {
		t.Fatalf("after the reset: %+v", msgs)
	}
}

// A keyed Consume has settled offset 1 out of order while offset 0's
// handler runs: a forced reset ends the lease, drops the settled offset,
// and everything is delivered again; the old handler's ack is refused.
func TestResetGroupForceKeyedSettled(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("resetkeyed")
	pushKeyed(t, q, "p", "k1", "k2")

	release := make(chan struct{})
	var deliveries [2]int
	var mu = make(chan struct{}, 1)
	mu <- struct{}{}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g", Batch: 10},
			KeyConcurrency: 2}, func(ctx context.Context, m *queen.Message) error {
			<-mu
			deliveries[m.Offset]++
			first := deliveries[m.Offset] == 1
			mu <- struct{}{}
			if m.Offset == 0 && first {
				<-release
			}
			return nil
		})
	}()
	waitFor(t, time.Minute, "offset 1 settled out of order", func() bool {
		g, _ := gstat(t, q, "g", "p")
		return g.Settled == 1 && g.Leased
	})
	mv, err := q.ResetGroup(ctx, "g", queen.ResetEarliest(), queen.ResetOptions{})
	if !errors.Is(err, queen.ErrGroupActive) {
		t.Fatalf("reset while leased: %+v, %v", mv, err)
	}
	mv, err = q.ResetGroup(ctx, "g", queen.ResetEarliest(), queen.ResetOptions{Force: true})
	if err != nil || len(mv) != 1 || !mv[0].LeaseEnded || mv[0].After != -1 {
		t.Fatalf("forced reset: %+v, %v", mv, err)
	}
	if g, _ := gstat(t, q, "g", "p"); g.Settled != 0 || g.Leased {
		t.Fatalf("after the forced reset: %+v", g)
	}
	close(release)
	waitFor(t, time.Minute, "both delivered again and committed", func() bool {
		<-mu
		d := deliveries
		mu <- struct{}{}
		g, _ := gstat(t, q, "g", "p")
		return d[0] >= 2 && d[1] >= 2 && g.Committed == 1
	})
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func TestDeleteGroup(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("delgroup")
	if err := q.Configure(ctx, queen.QueueOptions{CompletedRetention: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	pushEach(t, q, "a", 3)
	popOffsets(t, q, "fast", "a", true)
	held := pop(t, q, queen.PopOptions{Group: "slow", Partition: "a", Batch: 10}) // a lease
	if _, err := q.DeleteGroup(ctx, "slow", queen.DeleteGroupOptions{}); !errors.Is(err, queen.ErrGroupActive) {
		t.Fatalf("delete while leased: %v", err)
	}
	if err := q.Pause(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	// slow holds everything back from completed retention.
	if _, err := c.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(t, q); st.Partitions[0].LogStart != 0 {
		t.Fatalf("trimmed under slow: %+v", st)
	}
	d, err := q.DeleteGroup(ctx, "slow", queen.DeleteGroupOptions{Force: true})
	if err != nil || d != (queen.GroupDeleted{Cursors: 1, LeasesEnded: 1}) {
		t.Fatalf("forced delete: %+v, %v", d, err)
	}
	if _, ok := gstat(t, q, "slow", "a"); ok {
		t.Fatal("slow still has a cursor")
	}
	if err := held[0].Ack(ctx); !errors.Is(err, queen.ErrUnknownMessage) {
		t.Fatalf("Ack by the holder of a deleted group's lease: %v; want ErrUnknownMessage", err)
	}
	waitFor(t, time.Minute, "completed retention trims what only slow held", func() bool {
		if _, err := c.Maintain(ctx); err != nil {
			t.Fatal(err)
		}
		return status(t, q).Partitions[0].LogStart == 3
	})
	qs, err := c.Queues(ctx)
	if err != nil || len(qs[0].Groups) != 1 || qs[0].Groups[0].Group != "fast" {
		t.Fatalf("groups after delete: %+v, %v", qs, err)
	}
	if _, err := q.DeleteGroup(ctx, "slow", queen.DeleteGroupOptions{}); !errors.Is(err, queen.ErrNotFound) {
		t.Fatalf("delete again: %v; want ErrNotFound", err)
	}
	// A group used again after its delete starts over as a new one.
	pushEach(t, q, "a", 1)
	if got := popOffsets(t, q, "slow", "a", true); fmt.Sprint(got) != "[3]" {
		t.Fatalf("recreated group read %v", got)
	}
}

// ReleaseLease hands the batch to the next claim uncharged; the old
// holder's settlements are refused.
func TestReleaseLease(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("release")
	pushEach(t, q, "a", 2)
	old := pop(t, q, queen.PopOptions{Group: "g", Partition: "a", Batch: 2})
	if ok, err := q.ReleaseLease(ctx, "g", "a"); err != nil || !ok {
		t.Fatalf("ReleaseLease: %v, %v", ok, err)
	}
	again := pop(t, q, queen.PopOptions{Group: "g", Partition: "a", Batch: 2})
	if len(again) != 2 || again[0].Offset != 0 || again[0].Attempt != 1 {
		t.Fatalf("after release: %+v", again)
	}
	if err := old[1].Ack(ctx); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("old holder's Ack: %v; want ErrLeaseLost", err)
	}
	if err := old[0].Fail(ctx, errors.New("x")); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("old holder's Fail: %v; want ErrLeaseLost", err)
	}
	if err := old[0].ExtendLease(ctx, time.Minute); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("old holder's ExtendLease: %v; want ErrLeaseLost", err)
	}
	if err := again[1].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if g, _ := gstat(t, q, "g", "a"); g.Committed != 1 || g.Failures != 0 {
		t.Fatalf("after the new holder's ack: %+v", g)
	}
}

func TestOffsetsBadInput(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("bad")
	pushEach(t, q, "a", 1)
	none := queen.ResetOptions{}
	for name, err := range map[string]error{
		"reset unknown queue": func() error {
			_, err := c.Queue("nosuch").ResetGroup(ctx, "g", queen.ResetEarliest(), none)
			return err
		}(),
		"reset unknown partition": func() error {
			_, err := q.ResetGroup(ctx, "g", queen.ResetToOffsets(map[string]int64{"a": 0, "nosuch": 1}), none)
			return err
		}(),
		"reset unknown partition option": func() error {
			_, err := q.ResetGroup(ctx, "g", queen.ResetLatest(), queen.ResetOptions{Partitions: []string{"nosuch"}})
			return err
		}(),
		"delete unknown queue": func() error {
			_, err := c.Queue("nosuch").DeleteGroup(ctx, "g", queen.DeleteGroupOptions{})
			return err
		}(),
		"delete unknown group": func() error {
			_, err := q.DeleteGroup(ctx, "g", queen.DeleteGroupOptions{})
			return err
		}(),
		"release unknown queue": func() error {
			_, err := c.Queue("nosuch").ReleaseLease(ctx, "g", "a")
			return err
		}(),
		"release unknown partition": func() error {
			_, err := q.ReleaseLease(ctx, "g", "nosuch")
			return err
		}(),
	} {
		if !errors.Is(err, queen.ErrNotFound) {
			t.Errorf("%s: %v; want ErrNotFound", name, err)
		}
	}
	// Nothing of the refused resets stayed: no group was subscribed.
	if qs, err := c.Queues(ctx); err != nil || len(qs[0].Groups) != 0 {
		t.Fatalf("groups after refused calls: %+v, %v", qs, err)
	}
	for name, err := range map[string]error{
		"reset NUL group": func() error {
			_, err := q.ResetGroup(ctx, "g\x00", queen.ResetEarliest(), none)
			return err
		}(),
		"reset NUL partition": func() error {
			_, err := q.ResetGroup(ctx, "g", queen.ResetToOffsets(map[string]int64{"a\x00": 1}), none)
			return err
		}(),
		"reset NUL partition option": func() error {
			_, err := q.ResetGroup(ctx, "g", queen.ResetEarliest(), queen.ResetOptions{Partitions: []string{"\x00"}})
			return err
		}(),
		"reset NUL queue": func() error {
			_, err := c.Queue("q\x00").ResetGroup(ctx, "g", queen.ResetEarliest(), none)
			return err
		}(),
		"delete NUL group": func() error {
			_, err := q.DeleteGroup(ctx, "\x00", queen.DeleteGroupOptions{})
			return err
		}(),
		"release NUL partition": func() error {
			_, err := q.ReleaseLease(ctx, "g", "a\x00")
			return err
		}(),
		"release empty partition": func() error {
			_, err := q.ReleaseLease(ctx, "g", "")
			return err
		}(),
	} {
		if !errors.Is(err, queen.ErrInvalidName) {
			t.Errorf("%s: %v; want ErrInvalidName", name, err)
		}
	}
	if _, err := q.ResetGroup(ctx, "g", queen.ResetToOffsets(nil), none); err == nil {
		t.Error("reset to an empty map: no error")
	}
	if _, err := q.ResetGroup(ctx, "g", queen.ResetToOffsets(map[string]int64{"a": -1}), none); err == nil {
		t.Error("reset to a negative offset: no error")
	}
	if _, err := q.ResetGroup(ctx, "g", queen.ResetTo{}, none); err == nil {
		t.Error("reset to a zero ResetTo: no error")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := q.ResetGroup(cancelled, "g", queen.ResetEarliest(), none); !errors.Is(err, context.Canceled) {
		t.Errorf("reset with a cancelled ctx: %v", err)
	}
	if _, err := q.DeleteGroup(cancelled, "g", queen.DeleteGroupOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("delete with a cancelled ctx: %v", err)
	}
	if _, err := q.ReleaseLease(cancelled, "g", "a"); !errors.Is(err, context.Canceled) {
		t.Errorf("release with a cancelled ctx: %v", err)
	}
	if qs, err := c.Queues(ctx); err != nil || len(qs[0].Groups) != 0 {
		t.Fatalf("groups after refused calls: %+v, %v", qs, err)
	}
}
