package rlqs

import (
	"cmp"
	"slices"
)

// BucketView is what an operator sees of one bucket on this instance
// (GET /v1/rlqs, /ui): never the bucket id, only its subject.
type BucketView struct {
	Domain string
	// Policy is the matcher's policy ID. Example: "per-tenant".
	Policy string
	// Subject is the bucket's pseudonym, what a tenant plan names.
	Subject string
	// Streams is how many of this instance's streams hold the bucket.
	Streams int
	// Demand is their smoothed demand, requests per second. Example: 12.5.
	Demand float64
	// Rate and Burst are what they are assigned together, tokens per
	// second and tokens. Example: 40, 80.
	Rate, Burst float64
	// Allowed and Denied are what they reported since the bucket was
	// first reported here.
	Allowed, Denied uint64
}

// Buckets returns at most limit buckets (all when limit ≤ 0), by domain
// then subject.
func (s *Service) Buckets(limit int) []BucketView {
	var out []BucketView
	for _, d := range s.domainList() {
		d.mu.Lock()
		for _, b := range d.buckets {
			v := BucketView{Domain: d.name, Policy: b.policy.ID, Subject: b.subject, Streams: len(b.holds), Allowed: b.allowed, Denied: b.denied}
			for _, h := range b.holds {
				v.Demand += float64(h.demand) / 1000
				v.Rate += float64(h.assigned.rate) / 1000
				v.Burst += float64(h.assigned.burst) / 1000
			}
			out = append(out, v)
		}
		d.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b BucketView) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Subject, b.Subject))
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}
