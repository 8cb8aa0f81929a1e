package sluice

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
)

// maxLeaseIDLen is the longest lease id a Request may carry, in bytes.
const maxLeaseIDLen = 64

// newLeaseID returns a lease id for a spend by subject: random, or derived
// from evaluationID when set (a retry then names the same lease).
func newLeaseID(subject, evaluationID string) string {
	var b [16]byte
	if evaluationID != "" {
		h := sha256.Sum256([]byte("sluice lease\x00" + subject + "\x00" + evaluationID))
		copy(b[:], h[:])
	} else {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand's contract since Go 1.24)
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// leaseOf returns the lease an allowed Acquire or Renew of ev holds: on
// its Concurrency policies.
func leaseOf(ev *Evaluation) Lease {
	lease := Lease{ID: ev.LeaseID, Subject: ev.Subject}
	for _, p := range ev.Policies {
		if p.Algorithm == Concurrency {
			lease.Policies = append(lease.Policies, p.ID)
		}
	}
	return lease
}

// checkLeaseID reports whether id can name a lease: 1 to maxLeaseIDLen
// bytes of A-Z a-z 0-9 - _, the alphabet lease ids are written in.
func checkLeaseID(id string) error {
	if len(id) == 0 || len(id) > maxLeaseIDLen {
		return fmt.Errorf("sluice: %w: lease id is %d bytes: must be 1 to %d", ErrInvalidRequest, len(id), maxLeaseIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("sluice: %w: lease id byte %d is %q: must be one of A-Z a-z 0-9 - _", ErrInvalidRequest, i, c)
		}
	}
	return nil
}
