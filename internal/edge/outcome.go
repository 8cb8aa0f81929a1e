package edge

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
)

// This file is the one place the Core reads an Outcome's fields (Kind,
// Err, Status and its numbers, Statuses, Lease): a change to
// sluice.Outcome is answered here.

// verdict is the Action kind of a decided outcome o: Admit, Limit, or
// undecided (Unavailable, Indeterminate, Incompatible) for the failure
// mode to answer.
func verdict(o *sluice.Outcome) Kind {
	switch o.Kind {
	case sluice.Allowed:
		return Admit
	case sluice.Denied:
		return Limit
	}
	return undecided
}

// decided reports whether o carries the store's numbers.
func decided(o *sluice.Outcome) bool {
	return o.Kind == sluice.Allowed || o.Kind == sluice.Denied
}

// Rejected reports whether o is the request's fault (Incompatible, but
// not corrupt state): no failure mode applies, the edge answers an error
// of the caller.
func Rejected(o *sluice.Outcome) bool {
	return o.Kind == sluice.Incompatible && !errors.Is(o.Err, sluice.CorruptState)
}

// SetLimitHeaders sets the RateLimit field of the decided outcome o, and
// the X-RateLimit-* ones when legacy is set.
func SetLimitHeaders(h http.Header, o *sluice.Outcome, legacy bool) {
	h.Set("RateLimit", string(ratelimitheader.AppendLimitField(nil, *o)))
	if legacy {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(o.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(o.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(ratelimitheader.CeilSeconds(o.ResetAfter), 10))
	}
}

// leaseOf is the lease an admission holds, the zero Lease for none.
func leaseOf(o *sluice.Outcome) sluice.Lease { return o.Lease }

// retryAfter is the wait of a denial.
func retryAfter(o *sluice.Outcome) time.Duration { return o.RetryAfter }

// Statuses is every policy's status of o.
func Statuses(o *sluice.Outcome) []sluice.Status {
	if len(o.Statuses) == 0 {
		return []sluice.Status{o.Status}
	}
	return o.Statuses
}

// Violated lists the policies that denied o.
func Violated(o *sluice.Outcome) []string {
	if len(o.Statuses) == 0 {
		return []string{o.Policy}
	}
	var ids []string
	for _, s := range o.Statuses {
		if !s.Allowed {
			ids = append(ids, s.Policy)
		}
	}
	return ids
}

func appendPolicyItem(b []byte, p sluice.Policy) []byte {
	return ratelimitheader.AppendPolicyItem(b, p)
}
