package queen_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

type popResult struct {
	msgs []*queen.Message
	err  error
	at   time.Time
}

func popAsync(q *queen.Queue, ctx context.Context, o queen.PopOptions) <-chan popResult {
	ch := make(chan popResult, 1)
	go func() {
		m, err := q.Pop(ctx, o)
		ch <- popResult{m, err, time.Now()}
	}()
	return ch
}

// A waiting pop wakes on an in-process push, not on the rescan.
func TestPopWaitWakesOnPush(t *testing.T) {
	c := open(t, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	pushN(t, q, "warm", "w", 1) // the queue exists; the group is seeded
	ack(t, pop(t, q, queen.PopOptions{})[0])
	var lat []time.Duration
	for i := 0; i < 15; i++ {
		ch := popAsync(q, ctxT(t), queen.PopOptions{Wait: 10 * time.Second, Batch: 10})
		time.Sleep(20 * time.Millisecond)
		pushN(t, q, "hot", "m", 1)
		pushed := time.Now()
		r := <-ch
		if r.err != nil || len(r.msgs) != 1 {
			t.Fatalf("waiting pop = %q, %v", datas(r.msgs), r.err)
		}
		lat = append(lat, max(r.at.Sub(pushed), 0))
		ack(t, r.msgs[0])
	}
	slices.Sort(lat)
	t.Logf("push commit -> pop return: p50 %s, max %s", lat[len(lat)/2], lat[len(lat)-1])
	if lat[len(lat)/2] > 100*time.Millisecond {
		t.Fatalf("p50 wake latency %s", lat[len(lat)/2])
	}
}

func TestPopWaitTimesOut(t *testing.T) {
	c := open(t)
	start := time.Now()
	msgs, err := c.Queue("q").Pop(ctxT(t), queen.PopOptions{Wait: 300 * time.Millisecond})
	if err != nil || len(msgs) != 0 {
		t.Fatalf("Pop = %v, %v", msgs, err)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 5*time.Second {
		t.Fatalf("waited %s for a 300ms Wait", el)
	}
}

// Another process's push reaches a waiting pop through LISTEN/NOTIFY.
func TestPopWaitWakesOnOtherProcess(t *testing.T) {
	a := open(t, queen.PopRescan(time.Hour))
	b := open(t, queen.PopRescan(time.Hour), func(cfg *queen.Config) { cfg.Schema = a.Schema() })
	pushN(t, b.Queue("q"), "", "w", 1)
	ack(t, pop(t, a.Queue("q"), queen.PopOptions{})[0])
	time.Sleep(100 * time.Millisecond) // let a's listener settle
	ch := popAsync(a.Queue("q"), ctxT(t), queen.PopOptions{Wait: 20 * time.Second})
	time.Sleep(50 * time.Millisecond)
	pushN(t, b.Queue("q"), "", "m", 1)
	pushed := time.Now()
	r := <-ch
	if r.err != nil || len(r.msgs) != 1 {
		t.Fatalf("pop = %q, %v", datas(r.msgs), r.err)
	}
	if el := r.at.Sub(pushed); el > 5*time.Second {
		t.Fatalf("woken %s after the other process's push", el)
	}
}

// The rescan is the floor: a wake that never comes only delays. A pop
// waiting on a delayed message is woken by nothing but the rescan.
func TestPopWaitRescanFloor(t *testing.T) {
	c := open(t, queen.PopRescan(100*time.Millisecond))
	q := configure(t, c, "q", queen.QueueOptions{DelayedProcessing: 300 * time.Millisecond})
	pushN(t, q, "", "m", 1)
	r := <-popAsync(q, ctxT(t), queen.PopOptions{Wait: 5 * time.Second})
	if r.err != nil || len(r.msgs) != 1 {
		t.Fatalf("pop = %q, %v", datas(r.msgs), r.err)
	}
}

func TestPopWaitEndsOnCloseAndCancel(t *testing.T) {
	c := open(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	ch := popAsync(c.Queue("q"), ctx, queen.PopOptions{Wait: time.Minute})
	time.Sleep(50 * time.Millisecond)
	cancel()
	if r := <-ch; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiting pop = %v", r.err)
	}

	c2, err := queen.Open(ctxT(t), queen.Config{DatabaseURL: pgtest.URL(t), Schema: c.Schema(), Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ch = popAsync(c2.Queue("q"), ctxT(t), queen.PopOptions{Wait: time.Minute})
	time.Sleep(50 * time.Millisecond)
	if err := c2.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; !errors.Is(r.err, queen.ErrClosed) {
		t.Fatalf("waiting pop on close = %v, want ErrClosed", r.err)
	}
}
