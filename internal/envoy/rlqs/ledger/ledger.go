// Package ledger keeps what each sluice instance has reserved of every
// RLQS bucket's policy, so several instances behind one Envoy fleet
// divide one limit (docs/rlqs.md, "The bound").
//
// An instance claims, once a round and for all its buckets of a domain in
// one call, the share its streams wish for; the ledger grants it no more
// than the policy less what every other live instance has reserved, and
// reserves for it the larger of that grant and what its streams may still
// have in force (Claim.Committed). So at every instant the reservations of
// a bucket sum to at most its rate and burst, whatever the order of the
// instances' calls: a claim reads and writes atomically (one Lua call on
// Redis, one lock in the process).
//
// Amounts are integers: rates in milli-tokens per second, bursts in
// milli-tokens, demand in milli-requests per second.
package ledger

import (
	"context"
	"time"
)

// Claim is one instance's claim on one bucket.
type Claim struct {
	// Bucket names the bucket within its domain: its subject, the
	// pseudonym of the domain and the sorted bucket id.
	Bucket string
	// Rate and Burst are the bucket's policy (after plans).
	Rate, Burst int64
	// Demand is the demand of this instance's streams on the bucket, and
	// Streams how many of them report it.
	Demand, Streams int64
	// Wish and WishBurst are the sum of what this instance means to
	// hold for its streams this round: each one's target, or the
	// assignment its hysteresis keeps, or what it still has in force
	// when that is more.
	Wish, WishBurst int64
	// Committed and CommittedBurst are what this instance's streams may
	// have in force now: never more than its last reservation.
	Committed, CommittedBurst int64
}

// Grant is the ledger's answer to one Claim.
type Grant struct {
	// Rate and Burst are granted: the Claim's wish, at most the policy
	// less what the other live instances have reserved; never below 0.
	Rate, Burst int64
	// Reserved and ReservedBurst are reserved for the claiming instance:
	// the larger of its committed amounts and the grant.
	Reserved, ReservedBurst int64
	// Demand and Streams are the fleet's: every live instance's, the
	// claiming one's included.
	Demand, Streams int64
}

// MaxClaims is the most claims one Claim call carries: one call holds
// Redis for as long as it runs, so a caller with more buckets splits them
// into several calls (each claim is atomic on its own bucket, which is
// all the reservations' invariant needs).
const MaxClaims = 1000

// Ledger is the shared record of reservations. Implementations are safe
// for concurrent use.
type Ledger interface {
	// Claim claims cs (at most MaxClaims) for instance in one call,
	// atomically, and returns one Grant per Claim, in order. An instance's entries expire ttl after
	// its last claim of them. A Claim with no streams and nothing
	// committed removes the instance's entry of its bucket.
	Claim(ctx context.Context, domain, instance string, cs []Claim, ttl time.Duration) ([]Grant, error)
	// Release removes every entry of instance in domain: at shutdown,
	// once its streams were told their assignments expire now.
	Release(ctx context.Context, domain, instance string) error
}

// entry is one instance's record of one bucket.
type entry struct {
	instance string
	// expires is when the entry stops counting, µs since the Unix epoch.
	expires                 int64
	reserved, reservedBurst int64
	demand, streams         int64
}

// claim is the ledger's one computation, on the entries of c's bucket as
// they stand at now (µs): it returns the grant and the entries to store,
// expired ones dropped and the instance's own replaced (or removed, for a
// claim with no streams and nothing committed). claim.lua ports it.
func claim(now, ttl int64, instance string, c Claim, entries []entry) (Grant, []entry) {
	var g Grant
	var othersRate, othersBurst int64
	kept := entries[:0]
	for _, e := range entries {
		if e.expires <= now || e.instance == instance {
			continue
		}
		othersRate += e.reserved
		othersBurst += e.reservedBurst
		g.Demand += e.demand
		g.Streams += e.streams
		kept = append(kept, e)
	}
	g.Rate = max(0, min(c.Wish, c.Rate-othersRate))
	g.Burst = max(0, min(c.WishBurst, c.Burst-othersBurst))
	g.Reserved = max(c.Committed, g.Rate)
	g.ReservedBurst = max(c.CommittedBurst, g.Burst)
	g.Demand += c.Demand
	g.Streams += c.Streams
	if c.Streams > 0 || g.Reserved > 0 || g.ReservedBurst > 0 {
		kept = append(kept, entry{instance: instance, expires: now + ttl,
			reserved: g.Reserved, reservedBurst: g.ReservedBurst, demand: c.Demand, streams: c.Streams})
	}
	return g, kept
}
