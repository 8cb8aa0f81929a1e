// Package subject turns the identity of a caller into the key-safe
// pseudonym a Limiter sees, so no raw personal data reaches a store, a log
// line or a metric.
package subject

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"sync"
)

// minSecretLen is the shortest HMAC secret a Key may have, in bytes.
const minSecretLen = 16

// unkeyedID is the key id of pseudonyms made without a secret.
const unkeyedID = "u0"

// Key is one HMAC key. ID is part of every pseudonym it makes, so several
// keys can coexist while one is rotated out.
type Key struct {
	ID     string // 1 to 16 of [a-z0-9]
	Secret []byte // at least 16 bytes; 32 random bytes recommended
}

// Pseudonymizer maps (kind, identity, operation) triples to pseudonyms of
// the form "<key id>:<digest>", where digest is the first 128 bits of
// HMAC-SHA256 over the length-framed triple, in unpadded base64url. The
// first key signs; the others remain for lookups during rotation.
// Safe for concurrent use.
type Pseudonymizer struct {
	keys  []Key
	pools []sync.Pool // one per key, of hash.Hash
}

// New returns a Pseudonymizer over keys, newest first.
func New(keys []Key) (*Pseudonymizer, error) {
	if len(keys) == 0 {
		return nil, errors.New("subject: New: at least one key is required (use Unkeyed for none)")
	}
	seen := map[string]bool{}
	for i, k := range keys {
		if !validKeyID(k.ID) {
			return nil, fmt.Errorf("subject: keys[%d].id = %q: must be 1 to 16 of a-z 0-9", i, k.ID)
		}
		if seen[k.ID] {
			return nil, fmt.Errorf("subject: keys[%d].id = %q: used twice", i, k.ID)
		}
		seen[k.ID] = true
		if len(k.Secret) < minSecretLen {
			return nil, fmt.Errorf("subject: keys[%d] (%s): secret is %d bytes: must be at least %d", i, k.ID, len(k.Secret), minSecretLen)
		}
	}
	return newPseudonymizer(keys), nil
}

// Unkeyed returns a Pseudonymizer that digests with plain SHA-256 under key
// id "u0". Its pseudonyms hide identities from casual view only: anyone
// can recompute them from a guessed identity. Configure a keyed one.
func Unkeyed() *Pseudonymizer { return newPseudonymizer([]Key{{ID: unkeyedID}}) }

func newPseudonymizer(keys []Key) *Pseudonymizer {
	p := &Pseudonymizer{keys: append([]Key(nil), keys...), pools: make([]sync.Pool, len(keys))}
	for i := range p.keys {
		k := p.keys[i]
		p.pools[i].New = func() any {
			if k.Secret == nil {
				return &summer{h: sha256.New()}
			}
			return &summer{h: hmac.New(sha256.New, k.Secret)}
		}
	}
	return p
}

// Pseudonym returns the signing key's pseudonym of the triple, e.g.
// "k1:3q2-7wAAAAAAAAAAAAAAAA". kind names where the identity came from
// ("principal", "api_key", "ip", …); operation scopes it (a route), so the
// same caller on two routes gets two subjects.
func (p *Pseudonymizer) Pseudonym(kind, identity, operation string) string {
	return p.sum(0, kind, identity, operation)
}

// Previous returns the pseudonyms of the triple under every key but the
// signing one, newest first, or nil when there is one key: what
// sluice.Request.Previous takes, so that state kept under an older key is
// carried over during a rotation instead of starting a fresh budget.
func (p *Pseudonymizer) Previous(kind, identity, operation string) []string {
	if len(p.keys) == 1 {
		return nil
	}
	out := make([]string, len(p.keys)-1)
	for i := range out {
		out[i] = p.sum(i+1, kind, identity, operation)
	}
	return out
}

func (p *Pseudonymizer) sum(i int, kind, identity, operation string) string {
	sm := p.pools[i].Get().(*summer)
	defer p.pools[i].Put(sm)
	h := sm.h
	h.Reset()
	// The framed fields, written to the hash at once from a buffer kept
	// with it: a conversion of each field for hash.Hash's Write was an
	// allocation each.
	b := sm.buf[:0]
	for _, field := range [...]string{p.keys[i].ID, kind, identity, operation} {
		b = binary.AppendUvarint(b, uint64(len(field)))
		b = append(b, field...)
	}
	h.Write(b)
	if cap(b) <= 4<<10 { // a longer identity's buffer is not kept
		sm.buf = b[:0]
	}
	digest := h.Sum(sm.sum[:0])
	id := p.keys[i].ID
	out := make([]byte, len(id)+1+base64.RawURLEncoding.EncodedLen(16))
	copy(out, id)
	out[len(id)] = ':'
	base64.RawURLEncoding.Encode(out[len(id)+1:], digest[:16])
	return string(out)
}

// summer is a key's hash and the buffers of one sum.
type summer struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

// validKeyID reports whether id can name a Key: 1 to 16 of [a-z0-9].
func validKeyID(id string) bool {
	if len(id) < 1 || len(id) > 16 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
