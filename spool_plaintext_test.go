package queen_test

import (
	"errors"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
)

// Maintenance mode sends pushes to the disk spool. A payload of an
// encrypted queue must never reach the disk in plaintext, whatever the
// client had cached: a client with a key seals everything it spools (and the
// replay stores plain queues' messages as plaintext again); a client without
// a key spools only for queues it knows are not encrypted.
// TestPushDuringOutageBuffersWithinStatementTimeout covers a setting the
// database cannot tell.
func TestSpoolNeverHoldsPlaintextOfEncryptedQueue(t *testing.T) {
	key := make([]byte, 32)
	key[0] = 7
	admin := open(t, func(c *queen.Config) { c.EncryptionKey = key })
	ctx := ctxT(t)
	if err := admin.Queue("secret").Configure(ctx, queen.QueueOptions{Encryption: true}); err != nil {
		t.Fatal(err)
	}
	withKeyDir, noKeyDir := t.TempDir(), t.TempDir()
	withKey := open(t, func(c *queen.Config) { c.Schema, c.SpoolDir, c.EncryptionKey = admin.Schema(), withKeyDir, key })
	noKey := open(t, func(c *queen.Config) { c.Schema, c.SpoolDir = admin.Schema(), noKeyDir })
	// noKey has seen "plain" (unencrypted); neither has seen "secret".
	push(t, noKey.Queue("plain"), queen.Item{Partition: "plain", Data: []byte("plain-before")})

	if err := admin.SetMaintenance(ctx, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "both clients to see maintenance", func() bool { return withKey.Maintenance() && noKey.Maintenance() })

	buffered := func(c *queen.Client, queue, data string) {
		t.Helper()
		r := push(t, c.Queue(queue), queen.Item{Partition: queue, Data: []byte(data)})[0]
		if r.Status != queen.Buffered {
			t.Fatalf("push to %q: %+v, want Buffered", queue, r)
		}
	}
	buffered(withKey, "secret", "secret-payload-with-key")
	buffered(withKey, "plain", "plain-payload-with-key")
	if spoolHolds(t, withKeyDir, []byte("secret-payload-with-key")) {
		t.Fatal("the spool holds a payload of an encrypted queue in plaintext")
	}
	if spoolHolds(t, withKeyDir, []byte("plain-payload-with-key")) {
		t.Fatal("a client with a key spooled plaintext")
	}
	buffered(noKey, "plain", "plain-payload-without-key")
	buffered(noKey, "other", "other-payload-without-key")
	res, err := noKey.Queue("secret").Push(ctx, []queen.Item{{Partition: "secret", Data: []byte("secret-payload-without-key")}})
	if !errors.Is(err, queen.ErrEncryption) {
		t.Fatalf("push to an encrypted queue without a key: %v, %+v; want ErrEncryption", err, res)
	}
	if spoolHolds(t, noKeyDir, []byte("secret-payload-without-key")) {
		t.Fatal("the spool of the client without a key holds a payload of an encrypted queue")
	}

	if err := admin.SetMaintenance(ctx, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the spools to drain", func() bool {
		return withKey.SpoolStats().PendingRecords == 0 && noKey.SpoolStats().PendingRecords == 0
	})
	// Stored as the queue says: encrypted in "secret", plaintext in "plain".
	sec := storedFrames(t, admin, "secret")
	if len(sec) != 1 || sec[0].Flags&frame.FlagEncrypted == 0 {
		t.Fatalf("secret holds %d frames (%+v), want one encrypted", len(sec), sec)
	}
	plain := map[string]bool{}
	for _, f := range storedFrames(t, admin, "plain") {
		if f.Flags != 0 {
			t.Fatalf("plain holds a frame with flags %#x", f.Flags)
		}
		plain[string(f.Payload)] = true
	}
	if len(plain) != 3 || !plain["plain-payload-with-key"] || !plain["plain-payload-without-key"] {
		t.Fatalf("plain holds %v", plain)
	}
	got := drainAll(t, admin.Queue("secret"))
	if len(got) != 1 {
		t.Fatalf("secret delivered %v", got)
	}
	for _, d := range got {
		if d != "secret-payload-with-key" {
			t.Fatalf("secret delivered %q", d)
		}
	}
}
