package queen

import (
	"context"

	"github.com/e03140bc/queen/fusion"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/seal"
)

// flagSpoolSealed marks, in a spool record's flags only, a payload sealed
// for the spool rather than for its queue (see seal.FlagSpoolSealed).
const flagSpoolSealed = seal.FlagSpoolSealed

// sealForSpool encrypts the plaintext payloads of items about to be spooled,
// when the client has a key. The queue's setting may be stale or unknown
// when the database is away, and the spool must never hold an encrypted
// queue's payload in plaintext. Items the drain replays are never spooled
// again and are left alone.
func (e *engine) sealForSpool(key partitionKey, items []*pushItem) {
	if !e.keys.CanSeal() {
		return
	}
	for _, it := range items {
		if it.noSpool || it.Flags&frame.FlagEncrypted != 0 {
			continue
		}
		it.Payload = e.keys.Seal(key.Tenant, key.Queue, key.Partition, it.Key, it.Headers, it.ID, it.Payload)
		it.Flags |= frame.FlagEncrypted | flagSpoolSealed
	}
}

// openSpooled readies the items the drain replays that were sealed only for
// the spool (flagSpoolSealed): an encrypted queue takes the ciphertext as it
// is, any other queue its plaintext, so a queue stores what its setting
// says. It returns the batches whose items it had to fail (the key cannot
// open them), and an error if the queue's setting could not be read, which
// fails the bundle.
func (p *pusher) openSpooled(ctx context.Context, bundle []*fusion.Batch[partitionKey, *pushItem]) (map[*fusion.Batch[partitionKey, *pushItem]]bool, error) {
	e := p.e
	var skip map[*fusion.Batch[partitionKey, *pushItem]]bool
	for _, b := range bundle {
		sealed := false
		for _, it := range b.Items {
			if it.Flags&flagSpoolSealed != 0 {
				sealed = true
				break
			}
		}
		if !sealed {
			continue
		}
		meta, err := e.queueMeta(ctx, b.Key.Tenant, b.Key.Queue)
		if err != nil {
			return skip, err
		}
		var failed error
		for _, it := range b.Items {
			if it.Flags&flagSpoolSealed == 0 {
				continue
			}
			it.Flags &^= flagSpoolSealed
			if meta.Encryption {
				continue
			}
			plain, err := e.keys.Open(b.Key.Tenant, b.Key.Queue, b.Key.Partition, it.Key, it.Headers, it.ID, it.Payload)
			if err != nil {
				failed = err
				break
			}
			it.Payload, it.Flags = plain, it.Flags&^frame.FlagEncrypted
		}
		if failed != nil {
			for _, it := range b.Items {
				resolveFailed(it, failed)
			}
			if skip == nil {
				skip = make(map[*fusion.Batch[partitionKey, *pushItem]]bool)
			}
			skip[b] = true
		}
	}
	return skip, nil
}

// refuseWithoutKey is errNoKey when q is encrypted and this client has no
// key, for reads that would otherwise fail on every message.
func (q *Queue) refuseWithoutKey(ctx context.Context) error {
	e := q.c.e
	if e.keys.CanSeal() {
		return nil
	}
	meta, err := e.queueMeta(ctx, q.c.tenant, q.name)
	if err != nil {
		if e.isClosed() {
			return ErrClosed
		}
		return err
	}
	if meta.Encryption {
		return errNoKey(q.name)
	}
	return nil
}
