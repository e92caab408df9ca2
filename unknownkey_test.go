package queen_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// unknownKeySetup: queue "q" encrypted, its leases an hour long (a lease
// left behind would hide its partition for the rest of the test). A
// producer that already rotated to k2 sealed partition "x" (x0, x1); the
// consumer returned holds only k1, which sealed partition "a" (a0, when
// withA). rotated holds both, k2 to seal.
func unknownKeySetup(t *testing.T, withA bool) (consumer, rotated *queen.Client) {
	t.Helper()
	consumer = open(t, withKey(testKey(1)))
	producer := openOn(t, consumer, withKey(testKey(2)))
	rotated = openOn(t, consumer, func(cfg *queen.Config) {
		cfg.EncryptionKey, cfg.DecryptionKeys = testKey(2), [][]byte{testKey(1)}
	})
	configure(t, consumer, "q", queen.QueueOptions{Encryption: true, LeaseTime: time.Hour})
	if withA {
		pushN(t, consumer.Queue("q"), "a", "a", 1)
	}
	pushN(t, producer.Queue("q"), "x", "x", 2)
	return consumer, rotated
}

// wantUntouched checks that group's messages are all still there for a
// client with the keys, each at its first attempt, and that nothing was
// dead-lettered.
func wantUntouched(t *testing.T, rotated *queen.Client, group string, want ...string) {
	t.Helper()
	if n := countRows(t, rotated, "dead_letters"); n != 0 {
		t.Fatalf("%s: %d dead letters, want none", group, n)
	}
	// Pops to the first empty one: on the distributed layout a claim of
	// several partitions takes one worker's.
	var all []*queen.Message
	for range len(want) + 1 {
		msgs := pop(t, rotated.Queue("q"), queen.PopOptions{Group: group, Batch: 10, Partitions: 3})
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			if m.Attempt != 1 {
				t.Fatalf("%s: %s/%d at attempt %d, want 1 (nothing charged)", group, m.Partition, m.Offset, m.Attempt)
			}
		}
		ackAll(t, msgs)
		all = append(all, msgs...)
	}
	wantSorted(t, all, want...)
}

// A consumer without the key that sealed a message (the producers rotated
// first, or it has a wrong key) is misconfigured, as one without any key
// is: its Pop fails with ErrEncryption and takes nothing, with or without
// AutoAck. Nothing is consumed, leased, charged or dead-lettered, also in
// the other partitions the same claim took; a client with the key then
// gets every message at its first attempt.
func TestPopWithUnknownKeyIDTakesNothing(t *testing.T) {
	consumer, rotated := unknownKeySetup(t, true)
	q := consumer.Queue("q")
	for _, tc := range []struct {
		name string
		o    queen.PopOptions
	}{
		{"lease", queen.PopOptions{Batch: 10, Partitions: 3}},
		{"auto-ack", queen.PopOptions{Batch: 10, Partitions: 3, AutoAck: true}},
		{"lease-x", queen.PopOptions{Batch: 10, Partition: "x"}},
		{"auto-ack-x", queen.PopOptions{Batch: 10, Partition: "x", AutoAck: true}},
		{"lease-any", queen.PopOptions{Batch: 10}},
		{"auto-ack-any", queen.PopOptions{Batch: 10, AutoAck: true}},
	} {
		o := tc.o
		o.Group = tc.name
		// A single-partition pop may find "a" first: it is delivered and
		// acked; the pop that meets "x" must fail.
		var got []*queen.Message
		var err error
		for range 3 {
			var msgs []*queen.Message
			msgs, err = q.Pop(ctxT(t), o)
			if err != nil {
				break
			}
			if !o.AutoAck {
				ackAll(t, msgs)
			}
			got = append(got, msgs...)
		}
		if !errors.Is(err, queen.ErrEncryption) {
			t.Fatalf("%s: Pop with an unknown key id = %v (delivered %q), want ErrEncryption", tc.name, err, datas(got))
		}
		for _, m := range got {
			if m.Partition != "a" {
				t.Fatalf("%s: delivered %s/%d", tc.name, m.Partition, m.Offset)
			}
		}
		want := []string{"x0", "x1"}
		if len(got) == 0 {
			want = append(want, "a0")
		}
		wantUntouched(t, rotated, o.Group, want...)
	}
}

// Consume with a key that cannot open what it claims returns ErrEncryption
// (with or without KeyConcurrency, with or without AutoAck), having handled,
// charged and dead-lettered nothing.
func TestConsumeWithUnknownKeyIDFails(t *testing.T) {
	consumer, rotated := unknownKeySetup(t, false)
	q := consumer.Queue("q")
	for _, keyConc := range []int{0, 4} {
		for _, autoAck := range []bool{false, true} {
			g := fmt.Sprintf("k%d-auto%v", keyConc, autoAck)
			ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
			var handled atomic.Int32
			err := q.Consume(ctx, queen.ConsumeOptions{
				PopOptions:     queen.PopOptions{Group: g, Batch: 10, AutoAck: autoAck},
				KeyConcurrency: keyConc,
			}, func(context.Context, *queen.Message) error {
				handled.Add(1)
				return nil
			})
			cancel()
			if !errors.Is(err, queen.ErrEncryption) {
				t.Fatalf("%s: Consume with an unknown key id = %v, want ErrEncryption", g, err)
			}
			if n := handled.Load(); n != 0 {
				t.Fatalf("%s: %d messages handled", g, n)
			}
			wantUntouched(t, rotated, g, "x0", "x1")
		}
	}
}
