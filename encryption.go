package queen

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/fusion"
	"github.com/e03140bc/queen/internal/frame"
)

// Payload encryption (queues with Encryption on) is AES-256-GCM, one random
// 96-bit nonce per message. A stored encrypted payload is an envelope:
//
//	u8        envelope version (1)
//	[4]byte   key id: the first 4 bytes of SHA-256("queen key id\x00" || key)
//	[12]byte  nonce
//	bytes     ciphertext and 16-byte tag
//
// The GCM additional data is the version, the key id, the tenant, the
// message id, the queue, the partition, the message's ordering key and its
// headers, so a ciphertext copied over another message's, or into another
// partition, queue or tenant, or whose key or headers were altered, fails to
// decrypt instead of being delivered as that message. The key, like the
// partition, is routing metadata, and the headers are metadata for
// middleware (trace context) that must be readable without the key: both
// are stored in the clear, but authenticated. What moves a payload
// legitimately keeps them all: the skip policy's re-enqueue (same id, key,
// partition and queue), spool replay (the original tenant, queue,
// partition, key and id; a lane re-route seals again for the new lane),
// dead letters (a snapshot read with the same ones).
//
// The additional data is hdr || tenant || id || uvarint(len(queue)) ||
// queue || partition, followed by 0x00 || key when the key is non-empty,
// followed by 0x00 || key || 0x00 || headers (the encoded frame field, see
// internal/frame; the key possibly empty) when there are headers: partition
// names and keys never hold a NUL byte, so the three forms cannot collide.
//
// The key id names the key that sealed a payload, so keys rotate without
// rewriting data: new payloads are sealed with Config.EncryptionKey, and
// Config.DecryptionKeys open what older keys sealed. Random nonces bound a
// key's use: rotate well before 2^32 encrypted messages.
const (
	envelopeV1  byte = 1
	keyIDLen         = 4
	envelopeHdr      = 1 + keyIDLen
)

type keyID [keyIDLen]byte

func keyIDOf(key []byte) keyID {
	h := sha256.New()
	h.Write([]byte("queen key id\x00"))
	h.Write(key)
	var id keyID
	copy(id[:], h.Sum(nil))
	return id
}

// keyring is the client's keys: one to seal with, any number to open with
// (the sealing key among them), found by the id in the envelope.
type keyring struct {
	sealID keyID
	open   map[keyID]cipher.AEAD
}

// loadKeys sets the engine's keys from Config.EncryptionKey (sealKey) and
// Config.DecryptionKeys (old), both already checked to be 32 bytes each.
func (e *engine) loadKeys(sealKey []byte, old [][]byte) error {
	type named struct {
		key  []byte
		what string
	}
	var keys []named
	if sealKey != nil {
		keys = append(keys, named{sealKey, "Config.EncryptionKey"})
	}
	for i, k := range old {
		keys = append(keys, named{k, fmt.Sprintf("Config.DecryptionKeys[%d]", i)})
	}
	seen := make(map[keyID][]byte, len(keys))
	e.keys.open = make(map[keyID]cipher.AEAD, len(keys))
	for i, k := range keys {
		id := keyIDOf(k.key)
		if prev, ok := seen[id]; ok {
			if string(prev) != string(k.key) {
				return fmt.Errorf("%w: %s has the key id %x of another configured key; use another key", ErrEncryption, k.what, id)
			}
			continue // the same key listed twice
		}
		seen[id] = k.key
		b, err := aes.NewCipher(k.key)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrEncryption, k.what, err)
		}
		a, err := cipher.NewGCM(b)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrEncryption, k.what, err)
		}
		e.keys.open[id] = a
		if i == 0 && sealKey != nil {
			e.aead, e.keys.sealID = a, id
		}
	}
	return nil
}

// aad is the additional data binding a payload to its place and message.
func aad(hdr []byte, tenant uuid.UUID, queue, partition, key string, hdrs []byte, id uuid.UUID) []byte {
	b := make([]byte, 0, envelopeHdr+32+binary.MaxVarintLen64+len(queue)+len(partition)+2+len(key)+len(hdrs))
	b = append(b, hdr...)
	b = append(b, tenant[:]...)
	b = append(b, id[:]...)
	b = binary.AppendUvarint(b, uint64(len(queue)))
	b = append(b, queue...)
	b = append(b, partition...)
	if key != "" || len(hdrs) > 0 {
		b = append(b, 0)
		b = append(b, key...)
	}
	if len(hdrs) > 0 {
		b = append(b, 0)
		b = append(b, hdrs...)
	}
	return b
}

// seal encrypts message id's payload for its tenant, queue, partition, key
// and encoded headers with Config.EncryptionKey, which the caller checked is
// set.
func (e *engine) seal(tenant uuid.UUID, queue, partition, key string, hdrs []byte, id uuid.UUID, plain []byte) []byte {
	ns := e.aead.NonceSize()
	out := make([]byte, envelopeHdr+ns, envelopeHdr+ns+len(plain)+e.aead.Overhead())
	out[0] = envelopeV1
	copy(out[1:envelopeHdr], e.keys.sealID[:])
	if _, err := rand.Read(out[envelopeHdr:]); err != nil {
		panic("queen: crypto/rand failed: " + err.Error()) // rand.Read never fails on supported platforms
	}
	return e.aead.Seal(out, out[envelopeHdr:], plain, aad(out[:envelopeHdr], tenant, queue, partition, key, hdrs, id))
}

// open decrypts what seal produced for the same tenant, queue, partition,
// key, headers and message id, with whichever configured key sealed it.
func (e *engine) open(tenant uuid.UUID, queue, partition, key string, hdrs []byte, id uuid.UUID, sealed []byte) ([]byte, error) {
	if len(sealed) < envelopeHdr || sealed[0] != envelopeV1 {
		return nil, fmt.Errorf("%w: unknown envelope", ErrEncryption)
	}
	var kid keyID
	copy(kid[:], sealed[1:envelopeHdr])
	a := e.keys.open[kid]
	if a == nil {
		return nil, unknownKeyError{kid}
	}
	ns := a.NonceSize()
	if len(sealed) < envelopeHdr+ns {
		return nil, fmt.Errorf("%w: ciphertext too short", ErrEncryption)
	}
	nonce := sealed[envelopeHdr : envelopeHdr+ns]
	plain, err := a.Open(nil, nonce, sealed[envelopeHdr+ns:], aad(sealed[:envelopeHdr], tenant, queue, partition, key, hdrs, id))
	if err != nil {
		return nil, fmt.Errorf("%w: %w (tampered, or not this message's ciphertext)", ErrEncryption, err)
	}
	return plain, nil
}

// unknownKeyError is open's error for a payload sealed with a key this
// client does not hold: the client is misconfigured (a rotation reached the
// producers first, a wrong key), not the message broken, so a claim that
// meets one is given back instead of dead-lettered.
type unknownKeyError struct{ id keyID }

func (e unknownKeyError) Error() string {
	return fmt.Sprintf("%v: sealed with key id %x, which is neither Config.EncryptionKey nor in Config.DecryptionKeys",
		ErrEncryption, e.id)
}

func (unknownKeyError) Unwrap() error { return ErrEncryption }

// flagSpoolSealed marks, in a spool record's flags only, a payload that was
// encrypted for the spool rather than for its queue: the replay restores the
// plaintext unless the queue is encrypted. Frames never carry it.
const flagSpoolSealed byte = 1 << 7

// sealForSpool encrypts the plaintext payloads of items about to be spooled,
// when the client has a key. The queue's setting may be stale or unknown
// when the database is away, and the spool must never hold an encrypted
// queue's payload in plaintext. Items the drain replays are never spooled
// again and are left alone.
func (e *engine) sealForSpool(key fusion.Key, items []*pushItem) {
	if e.aead == nil {
		return
	}
	for _, it := range items {
		if it.noSpool || it.Flags&frame.FlagEncrypted != 0 {
			continue
		}
		it.Payload = e.seal(key.Tenant, key.Queue, key.Partition, it.Key, it.Headers, it.ID, it.Payload)
		it.Flags |= frame.FlagEncrypted | flagSpoolSealed
	}
}

// openSpooled readies the items the drain replays that were sealed only for
// the spool (flagSpoolSealed): an encrypted queue takes the ciphertext as it
// is, any other queue its plaintext, so a queue stores what its setting
// says. It returns the batches whose items it had to fail (the key cannot
// open them), and an error if the queue's setting could not be read, which
// fails the bundle.
func (p *pusher) openSpooled(ctx context.Context, bundle []*fusion.Batch[fusion.Key, *pushItem]) (map[*fusion.Batch[fusion.Key, *pushItem]]bool, error) {
	e := p.e
	var skip map[*fusion.Batch[fusion.Key, *pushItem]]bool
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
			if meta.encryption {
				continue
			}
			plain, err := e.open(b.Key.Tenant, b.Key.Queue, b.Key.Partition, it.Key, it.Headers, it.ID, it.Payload)
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
				skip = make(map[*fusion.Batch[fusion.Key, *pushItem]]bool)
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
	if e.aead != nil {
		return nil
	}
	meta, err := e.queueMeta(ctx, q.c.tenant, q.name)
	if err != nil {
		if e.isClosed() {
			return ErrClosed
		}
		return err
	}
	if meta.encryption {
		return errNoKey(q.name)
	}
	return nil
}
