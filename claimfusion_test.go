package queen_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// Concurrent pops share claims, and each still gets what a pop of its own
// would: the messages of one partition nobody else holds, at most its Batch.
func TestPopClaimFusion(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	const parts, per, pops = 40, 5, 40
	for p := range parts {
		pushN(t, q, fmt.Sprintf("p%02d", p), "m", per)
	}
	round := func(batch int) [][]*queen.Message {
		got := make([][]*queen.Message, pops)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range pops {
			wg.Go(func() {
				<-start
				msgs, err := q.Pop(ctxT(t), queen.PopOptions{Batch: batch})
				if err != nil {
					t.Error(err)
				}
				got[i] = msgs
			})
		}
		close(start)
		wg.Wait()
		return got
	}

	before := c.Stats()
	got := round(3)
	after := c.Stats()
	if after.Pops-before.Pops != pops {
		t.Fatalf("Stats counted %d pops, want %d", after.Pops-before.Pops, pops)
	}
	if claims := after.Claims - before.Claims; claims >= pops {
		t.Fatalf("%d concurrent pops ran %d claims: nothing was fused", pops, claims)
	}
	held := map[string]bool{}
	served := 0
	for _, msgs := range got {
		if len(msgs) == 0 {
			continue
		}
		served++
		if len(msgs) != 3 {
			t.Fatalf("a pop got %d messages, want its Batch (3)", len(msgs))
		}
		p := msgs[0].Partition
		if held[p] {
			t.Fatalf("partition %s handed to two pops", p)
		}
		held[p] = true
		for k, m := range msgs {
			if m.Partition != p || m.Offset != int64(k) {
				t.Fatalf("pop got %s/%d at position %d, want %s/%d", m.Partition, m.Offset, k, p, k)
			}
		}
	}
	if served == 0 {
		t.Fatal("no pop got anything")
	}

	// The claimed partitions stay leased; the others still serve (on the
	// Citus layout, where a claim takes one worker's partitions, the first
	// round leaves some): each pop one partition no other pop holds.
	for _, msgs := range round(10) {
		if len(msgs) == 0 {
			continue
		}
		p := msgs[0].Partition
		if held[p] {
			t.Fatalf("partition %s delivered while leased", p)
		}
		held[p] = true
		for _, m := range msgs {
			if m.Partition != p {
				t.Fatalf("a pop of one partition got %s and %s", p, m.Partition)
			}
		}
	}
}

// A pop waiting for a shared claim gives up when its context ends, without
// taking a lease with it; the claim in flight still delivers to its own pop.
func TestPopClaimFusionCancelWhileWaiting(t *testing.T) {
	skipOnLayout(t, "a lock shape: it blocks a claim on a subscriptions row, a reference table, whose writes lock every node")
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "a", "a", 1)
	pushN(t, q, "b", "b", 1)
	ctx := ctxT(t)

	// Hold the group's subscription insert open: the group's first pop then
	// waits inside its claim, and a second pop queues behind it.
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	s := pgx.Identifier{c.Schema()}.Sanitize()
	if _, err := tx.Exec(ctx, `INSERT INTO `+s+`.subscriptions (queue_id, group_name, mode)
		SELECT id, 'g', 'all' FROM `+s+`.queues WHERE name = 'q'`); err != nil {
		t.Fatal(err)
	}
	first := make(chan []*queen.Message, 1)
	go func() {
		msgs, err := q.Pop(ctx, queen.PopOptions{Group: "g"})
		if err != nil {
			t.Error(err)
		}
		first <- msgs
	}()
	waitFor(t, 10*time.Second, "the first claim to block", func() bool {
		var n int
		err := c.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'.pop_v2(%'`, s).Scan(&n)
		return err == nil && n > 0
	})

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := q.Pop(short, queen.PopOptions{Group: "g"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting pop = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("waiting pop returned after %s", d)
	}
	select {
	case <-first:
		t.Fatal("the first pop finished while its claim was blocked")
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := <-first
	if len(msgs) != 1 {
		t.Fatalf("first pop got %d messages, want 1", len(msgs))
	}
	// The cancelled pop took nothing: the other partition is still there.
	rest := pop(t, q, queen.PopOptions{Group: "g", Batch: 10})
	if len(rest) != 1 || rest[0].Partition == msgs[0].Partition {
		t.Fatalf("after the cancelled pop: %q, first got %q", datas(rest), datas(msgs))
	}
}
