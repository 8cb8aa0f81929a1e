package sluice

// requestform.go holds the rules of form a Limiter checks before a store
// sees a request (a subject's bytes, an evaluation id, a lease id, the
// older subjects of a key rotation, a policy ID) and the error for a
// policy it does not have: the checks only the Limiter knows, each an
// error naming the field, the value and the rule. The operation's own
// rules are the decision engine's (internal/engine/algorithm), checked by
// the store. A policy's own rules are in policyform.go.

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/internal/engine/algorithm"
	"github.com/sluicehq/sluice/internal/policyerr"
)

// The bounds of a Request's fields (sluice.Request's comments state them).
const (
	maxSubject      = 200 // bytes of a subject
	maxPrevious     = 4   // older subjects a request may name: the keys rotated out at once
	maxEvaluationID = 128 // bytes of an evaluation id
	maxLeaseID      = 64  // bytes of a lease id
	maxPolicyID     = 64  // bytes of a policy ID
)

// errInvalid is the error every form rule wraps: ErrInvalidRequest.
var errInvalid = algorithm.ErrInvalidRequest

// checkSubject reports whether s can be a Request.Subject: 1 to 200 bytes of
// printable ASCII other than space, '{' and '}' (braces delimit Redis
// Cluster hash tags).
func checkSubject(s string) error {
	if len(s) == 0 || len(s) > maxSubject {
		return fmt.Errorf("sluice: %w: subject is %d bytes: must be 1 to %d", errInvalid, len(s), maxSubject)
	}
	if keySafe(s) {
		return nil
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !subjectByte(c) {
			return fmt.Errorf("sluice: %w: subject byte %d is %q: must be printable ASCII other than space, '{' and '}'", errInvalid, i, c)
		}
	}
	return nil
}

// subjectByte reports whether c may be in a subject: printable ASCII other
// than space, '{' and '}'.
func subjectByte(c byte) bool {
	return c > ' ' && c <= '~' && c != '{' && c != '}'
}

// Bytes repeated over a word, for keySafe.
const (
	lows  = 0x0101010101010101
	highs = 0x8080808080808080
)

// keySafe reports whether every byte of s is printable ASCII other than
// space, '{' and '}', as Subject demands: eight bytes at a time (a
// subject is checked on every request; a byte at a time cost a 43-byte
// pseudonym more than the rest of the checks together). A word holds a
// byte that is not when, per byte, it is below '!' (b − '!' borrows into
// the high bit of a byte whose own high bit is clear), above '~' (b + 1
// reaches the high bit, or it was set), or equals '{' or '}' (the XOR is
// zero). Each test is exact about whether some byte of the word fails,
// which is all this answers.
func keySafe(s string) bool {
	if len(s) < 8 {
		for i := 0; i < len(s); i++ {
			if !subjectByte(s[i]) {
				return false
			}
		}
		return true
	}
	var bad uint64
	for i := 0; ; i += 8 {
		if i > len(s)-8 {
			i = len(s) - 8 // the last word overlaps the one before: no byte left out
		}
		x := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		lb, rb := x^('{'*lows), x^('}'*lows)
		bad |= (x-'!'*lows)&^x | (x + lows) | x | (lb-lows)&^lb | (rb-lows)&^rb
		if i == len(s)-8 {
			break
		}
	}
	return bad&highs == 0
}

// checkCarried reports whether what a request carries beside its subject and
// policies is well-formed: previous, its subject's pseudonyms under older
// keys (at most 4, each a valid subject other than subject); its
// evaluation id (at most 128 bytes of printable ASCII other than space);
// its lease id (see LeaseID).
func checkCarried(subject string, previous []string, evaluationID, leaseID string) error {
	if len(previous) > maxPrevious {
		return fmt.Errorf("sluice: %w: previous names %d subjects: must be at most %d", errInvalid, len(previous), maxPrevious)
	}
	for i, prev := range previous {
		if err := checkSubject(prev); err != nil {
			return fmt.Errorf("sluice: previous[%d]: %w", i, err)
		}
		if prev == subject {
			return fmt.Errorf("sluice: %w: previous[%d] is the subject itself", errInvalid, i)
		}
	}
	if len(evaluationID) > maxEvaluationID {
		return fmt.Errorf("sluice: %w: evaluation id is %d bytes: must be at most %d", errInvalid, len(evaluationID), maxEvaluationID)
	}
	for i := 0; i < len(evaluationID); i++ {
		if c := evaluationID[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("sluice: %w: evaluation id byte %d is %q: must be printable ASCII other than space", errInvalid, i, c)
		}
	}
	if leaseID != "" {
		return checkLeaseID(leaseID)
	}
	return nil
}

// checkLeaseID reports whether id can name a lease: 1 to 64 bytes of A-Z a-z
// 0-9 - _, the alphabet lease ids are written in.
func checkLeaseID(id string) error {
	if len(id) == 0 || len(id) > maxLeaseID {
		return fmt.Errorf("sluice: %w: lease id is %d bytes: must be 1 to %d", errInvalid, len(id), maxLeaseID)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("sluice: %w: lease id byte %d is %q: must be one of A-Z a-z 0-9 - _", errInvalid, i, c)
		}
	}
	return nil
}

// newLeaseID returns a lease id for an acquire by subject: random, or
// derived from evaluationID when set (a retry then names the same lease).
func newLeaseID(subject, evaluationID string) string {
	if evaluationID == "" {
		return newID()
	}
	h := sha256.Sum256([]byte("sluice lease\x00" + subject + "\x00" + evaluationID))
	return base64.RawURLEncoding.EncodeToString(h[:16])
}

// newID returns a random id of 16 bytes, as an evaluation or lease id.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand's contract since Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// validPolicyID reports whether id can name a policy: 1 to 64 of
// [A-Za-z0-9_.-].
func validPolicyID(id string) bool {
	if len(id) < 1 || len(id) > maxPolicyID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// unknownPolicy is the error for a policy id a Limiter does not have, in field,
// naming the ones it has (the first few of ids).
func unknownPolicy(field, id string, ids []string) error {
	const shown = 8
	quoted := make([]string, 0, shown)
	for _, known := range ids[:min(len(ids), shown)] {
		quoted = append(quoted, fmt.Sprintf("%q", known))
	}
	known := strings.Join(quoted, ", ")
	if len(ids) > shown {
		known += fmt.Sprintf(" and %d more", len(ids)-shown)
	}
	return fmt.Errorf("sluice: %s %q: %w: the policies are %s", field, id, policyerr.ErrUnknownPolicy, known)
}

// policiesOf appends to into the policies a request names (one, or several
// none twice, not both), found by find (nil: none such), and returns it;
// ids are the ones there are, for the error of one unknown.
func policiesOf(into []*Policy, one string, several []string, find func(id string) *Policy, ids []string) ([]*Policy, error) {
	var none *Policy
	switch {
	case one != "" && len(several) > 0:
		return into, fmt.Errorf("sluice: %w: set policy or policies, not both", errInvalid)
	case one != "":
		p := find(one)
		if p == none {
			return into, unknownPolicy("policy", one, ids)
		}
		return append(into, p), nil
	case len(several) == 0:
		return into, fmt.Errorf("sluice: %w: policy is required", errInvalid)
	}
	for i, id := range several {
		p := find(id)
		if p == none {
			return into, unknownPolicy(fmt.Sprintf("policies[%d]", i), id, ids)
		}
		for _, q := range into {
			if q == p {
				return into, fmt.Errorf("sluice: %w: policies[%d] %q is named twice", errInvalid, i, id)
			}
		}
		into = append(into, p)
	}
	return into, nil
}
