package rls

import (
	"errors"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/envoy/rules"
	"github.com/sluicehq/sluice/subject"
)

// leaseKind is the kind folded into the pseudonym that names an
// in-flight lease (see leaseID).
const leaseKind = "envoy-lease"

// inFlight prepares d, whose rule is an in-flight one
// (rules.Rule.InFlight), from the request descriptor rd: the value
// of its last entry names the lease, which the request-time call
// acquires (one slot, whatever the hits) and the stream-done call gives
// back. Envoy sends the stream-done call (a rate_limits entry with
// apply_on_stream_done) with the descriptor's hits_addend negative
// (is_negative_hits) or 0, so either is a release. It returns the
// entries that name the subject: vars without the lease's.
func inFlight(st *State, d *descriptor, rd *commonpb.RateLimitDescriptor, domain string, vars []rules.Entry) ([]rules.Entry, error) {
	last := vars[len(vars)-1] // the rule's descriptor has no value: its entry is a variable
	if last.Value == "" {
		return nil, errors.New("entries: the value of " + last.Key + ", which names the in-flight lease, is empty")
	}
	d.lease = leaseID(st.Pseudonymizer, domain, last.Value)
	h := rd.GetHitsAddend()
	d.release = rd.GetIsNegativeHits() || h != nil && h.GetValue() == 0
	d.cost, d.refund = 1, false
	return vars[:len(vars)-1], nil
}

// leaseID names the lease of an in-flight descriptor whose lease entry
// holds value: its pseudonym (so no raw value reaches the store), in the
// alphabet of lease ids (A-Z a-z 0-9 - _), at most 64 bytes. A key
// rotation between the two calls of one request changes the name: the
// release then finds nothing, and the lease is reclaimed after its TTL.
func leaseID(p *subject.Pseudonymizer, domain, value string) string {
	b := []byte(p.Pseudonym(leaseKind, value, domain))
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	return string(b[:min(len(b), 64)])
}
