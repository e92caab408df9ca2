// Package seal encrypts and decrypts payloads of queues with Encryption on
// (AES-256-GCM), with a client's keyring. It imports nothing of queen's but
// its error values.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/internal/errs"
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

// KeyID names a key in an envelope.
type KeyID [keyIDLen]byte

func keyIDOf(key []byte) KeyID {
	h := sha256.New()
	h.Write([]byte("queen key id\x00"))
	h.Write(key)
	var id KeyID
	copy(id[:], h.Sum(nil))
	return id
}

// Keyring is a client's keys: one to seal with, any number to open with
// (the sealing key among them), found by the id in the envelope. The zero
// value holds no key.
type Keyring struct {
	aead   cipher.AEAD // the sealing key; nil without one
	sealID KeyID
	open   map[KeyID]cipher.AEAD
}

// CanSeal reports whether the keyring has a key to seal with.
func (k *Keyring) CanSeal() bool { return k.aead != nil }

// Load makes a keyring of sealKey (Config.EncryptionKey; nil for none) and
// old (Config.DecryptionKeys), both already checked to be 32 bytes each.
func Load(sealKey []byte, old [][]byte) (Keyring, error) {
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
	seen := make(map[KeyID][]byte, len(keys))
	kr := Keyring{open: make(map[KeyID]cipher.AEAD, len(keys))}
	for i, k := range keys {
		id := keyIDOf(k.key)
		if prev, ok := seen[id]; ok {
			if string(prev) != string(k.key) {
				return Keyring{}, fmt.Errorf("%w: %s has the key id %x of another configured key; use another key", errs.ErrEncryption, k.what, id)
			}
			continue // the same key listed twice
		}
		seen[id] = k.key
		b, err := aes.NewCipher(k.key)
		if err != nil {
			return Keyring{}, fmt.Errorf("%w: %s: %w", errs.ErrEncryption, k.what, err)
		}
		a, err := cipher.NewGCM(b)
		if err != nil {
			return Keyring{}, fmt.Errorf("%w: %s: %w", errs.ErrEncryption, k.what, err)
		}
		kr.open[id] = a
		if i == 0 && sealKey != nil {
			kr.aead, kr.sealID = a, id
		}
	}
	return kr, nil
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

// Seal encrypts message id's payload for its tenant, queue, partition, key
// and encoded headers with the sealing key, which the caller checked is
// set (CanSeal).
func (k *Keyring) Seal(tenant uuid.UUID, queue, partition, key string, hdrs []byte, id uuid.UUID, plain []byte) []byte {
	ns := k.aead.NonceSize()
	out := make([]byte, envelopeHdr+ns, envelopeHdr+ns+len(plain)+k.aead.Overhead())
	out[0] = envelopeV1
	copy(out[1:envelopeHdr], k.sealID[:])
	if _, err := rand.Read(out[envelopeHdr:]); err != nil {
		panic("queen: crypto/rand failed: " + err.Error()) // rand.Read never fails on supported platforms
	}
	return k.aead.Seal(out, out[envelopeHdr:], plain, aad(out[:envelopeHdr], tenant, queue, partition, key, hdrs, id))
}

// Open decrypts what Seal produced for the same tenant, queue, partition,
// key, headers and message id, with whichever configured key sealed it.
func (k *Keyring) Open(tenant uuid.UUID, queue, partition, key string, hdrs []byte, id uuid.UUID, sealed []byte) ([]byte, error) {
	if len(sealed) < envelopeHdr || sealed[0] != envelopeV1 {
		return nil, fmt.Errorf("%w: unknown envelope", errs.ErrEncryption)
	}
	var kid KeyID
	copy(kid[:], sealed[1:envelopeHdr])
	a := k.open[kid]
	if a == nil {
		return nil, UnknownKeyError{kid}
	}
	ns := a.NonceSize()
	if len(sealed) < envelopeHdr+ns {
		return nil, fmt.Errorf("%w: ciphertext too short", errs.ErrEncryption)
	}
	nonce := sealed[envelopeHdr : envelopeHdr+ns]
	plain, err := a.Open(nil, nonce, sealed[envelopeHdr+ns:], aad(sealed[:envelopeHdr], tenant, queue, partition, key, hdrs, id))
	if err != nil {
		return nil, fmt.Errorf("%w: %w (tampered, or not this message's ciphertext)", errs.ErrEncryption, err)
	}
	return plain, nil
}

// UnknownKeyError is Open's error for a payload sealed with a key this
// client does not hold: the client is misconfigured (a rotation reached the
// producers first, a wrong key), not the message broken, so a claim that
// meets one is given back instead of dead-lettered.
type UnknownKeyError struct{ ID KeyID }

func (e UnknownKeyError) Error() string {
	return fmt.Sprintf("%v: sealed with key id %x, which is neither Config.EncryptionKey nor in Config.DecryptionKeys",
		errs.ErrEncryption, e.ID)
}

func (UnknownKeyError) Unwrap() error { return errs.ErrEncryption }

// FlagSpoolSealed marks, in a spool record's flags only, a payload that was
// encrypted for the spool rather than for its queue: the replay restores the
// plaintext unless the queue is encrypted. Frames never carry it.
const FlagSpoolSealed byte = 1 << 7
