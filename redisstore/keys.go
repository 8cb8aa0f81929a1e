package redisstore

import (
	"strconv"

	"github.com/sluicehq/sluice"
)

// key returns the Redis key of p's state for subject: see the package
// documentation.
func (s *Store) key(subject string, p *sluice.Policy) string {
	return s.policyKey(subject, p, s.stateSuffix(p))
}

// appendKey appends key's key to b.
func (s *Store) appendKey(b []byte, subject string, p *sluice.Policy) []byte {
	return s.appendPolicyKey(b, subject, p, s.stateSuffix(p))
}

// stateSuffix returns the last part of p's state key: the code of the
// record it keeps.
func (s *Store) stateSuffix(p *sluice.Policy) string {
	switch {
	case p.Period != "":
		return "p" // a calendar period's (algorithm.FixedPeriod), on either clock
	case p.Algorithm == sluice.FixedWindow && s.clock == nil && p.ClockAligned:
		// On Redis time a fixed window keeps another record
		// (algorithm.FixedWindowEnd): another key.
		return "E"
	case p.Algorithm == sluice.FixedWindow && s.clock == nil:
		return "e"
	case p.ClockAligned:
		return "F" // another window than first-request's: another key
	}
	return algorithmCodes[p.Algorithm]
}

// policyKey returns the key of p for subject that ends in suffix: the
// algorithm code of its state, or one of the evaluation-id records.
func (s *Store) policyKey(subject string, p *sluice.Policy, suffix string) string {
	var room [128]byte
	return string(s.appendPolicyKey(room[:0], subject, p, suffix))
}

// appendPolicyKey appends policyKey's key to b.
func (s *Store) appendPolicyKey(b []byte, subject string, p *sluice.Policy, suffix string) []byte {
	b = append(b, s.prefix...)
	b = append(b, '{')
	b = append(b, subject...)
	b = append(b, '}')
	b = append(b, p.ID...)
	b = append(b, ':')
	b = strconv.AppendInt(b, p.Revision, 10)
	b = append(b, ':')
	return append(b, suffix...)
}
