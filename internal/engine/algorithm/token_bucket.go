package algorithm

import "fmt"

// TokenBucket is the state of a token bucket.
//
// Model: a bucket holds up to Params.Burst tokens and refills continuously
// at Params.Limit tokens per Params.Window µs; a request of cost c takes c
// tokens when at least c are there. Tokens are counted in fractions of
// 1/Window token (scaled by Window), so the refill of every microsecond is an
// exact integer: Limit scaled units.
//
// Burst: up to Burst at once after idling, then the steady rate. Accuracy:
// exact. State: three integers (tokens, last refill, the window they are
// scaled by). For the same Params, TokenBucket and GCRA admit exactly the
// same requests; they differ in what they store.
//
// After a policy's numbers change under the same revision, the tokens carry
// over as whole tokens (rounded down), never more than the new Burst.
type TokenBucket struct {
	Tokens int64 // tokens × Window at Last; meaningful only when Last != 0
	Last   int64 // µs of the newest write; 0 = absent (a full bucket)
	Window int64 // the Params.Window Tokens is scaled by
}

// tokenBucketOf reads a TokenBucket from the fields of a State.
func tokenBucketOf(v *[5]int64) TokenBucket {
	return TokenBucket{Tokens: v[0], Last: v[1], Window: v[2]}
}

// fields writes s as the fields of a State to v, one at a time (a
// [5]int64 built and then copied whole is read back before its stores
// land, which stalls some CPUs).
func (s TokenBucket) fields(v *[5]int64) {
	v[0], v[1], v[2], v[3], v[4] = s.Tokens, s.Last, s.Window, 0, 0
}

// corrupt returns why s is no state Decide or Refund leaves to keep, or
// "": a kept bucket was written at Last >= 1 under a policy's window, and
// holds less than that policy's full bucket, burst × window, which is at
// most 10^9 × window and below 2^53 − 1, and more than 10^9 × window
// below empty (a settle's debt, settle.go, is at most 10^9 units).
func (s TokenBucket) corrupt() string {
	switch {
	case s.Last < 1 || s.Window < MinWindow || s.Window > MaxWindow:
		return fmt.Sprintf("last write %d, window %d: want a write time and a window of 1ms to 365 days", s.Last, s.Window)
	case s.Tokens/s.Window >= MaxLimit || s.Tokens > MaxExact-2 || s.Tokens < 0 && -s.Tokens/s.Window >= MaxLimit: // |Tokens| ≥ MaxLimit × Window, without the product (it may pass 2^63); a second division only below empty
		return fmt.Sprintf("tokens %d: want fewer than a full bucket under window %d, and less debt than 10^9 tokens", s.Tokens, s.Window)
	}
	return ""
}

// tokens returns the stored tokens scaled by p.Window, at most a full
// bucket: whole tokens when they were scaled by another window, at least
// none (a debt below empty, a settle's or a booking's, is not carried
// across windows: GCRA's reschedule keeps at most Burst units
// outstanding, and the two agree).
func (s TokenBucket) tokens(p Params) int64 {
	if s.Window != 0 && s.Window != p.Window {
		return min(max(s.Tokens/s.Window, 0), p.Burst) * p.Window
	}
	return min(s.Tokens, p.Burst*p.Window)
}

// level returns the scaled tokens in the bucket at now.
func (s TokenBucket) level(p Params, now int64) int64 {
	full := p.Burst * p.Window
	if s.Last == 0 {
		return full
	}
	tokens := s.tokens(p)
	// Refill, capping the elapsed time first so elapsed × Limit cannot overflow.
	elapsed := now - s.Last
	if elapsed >= ceilDiv(full-tokens, p.Limit) {
		return full
	}
	return tokens + elapsed*p.Limit
}

// Decide evaluates cost at now and returns the new state and the decision.
//
// hold > 0 makes it a held spend (Evaluation.Hold), GCRA.Decide's rule in
// tokens: the level is first capped at Burst·Window − hold·Limit (what a
// full bucket holds after hold with nothing refilled), then the cost is
// taken as usual and the state written at now. Since the level is
// Burst·Window minus GCRA's debt, the cap is GCRA's floor on the debt:
// the two admit the same held spends and leave the same schedule, and
// GCRA.Decide's proof that a block covers every unit used during its
// hold holds for both. hold 0 is the plain spend.
func (s TokenBucket) Decide(p Params, now, cost, hold int64) (TokenBucket, Decision) {
	full := p.Burst * p.Window
	tokens := min(s.level(p, now), full-hold*p.Limit) // hold·Limit ≤ full
	d := Decision{Limit: p.Burst}
	// The tokens kept back for a more important class count as missing.
	need, reserved := verdictCost(cost)*p.Window, int64(p.Reserve)*p.Window
	if tokens-reserved < need {
		d.Remaining = max(tokens-reserved, 0) / p.Window // below empty after a settle's debt
		d.RetryAfter = ceilDiv(need-(tokens-reserved), p.Limit)
		d.ResetAfter = ceilDiv(full-tokens, p.Limit)
		return s, d
	}
	if cost > 0 {
		tokens -= cost * p.Window
		s = TokenBucket{Tokens: tokens, Last: now, Window: p.Window}
	}
	d.Allowed = true
	d.Remaining = (tokens - reserved) / p.Window
	d.ResetAfter = ceilDiv(full-tokens, p.Limit)
	return s, d
}

// Expires returns the instant from which s equals an absent state (a full
// bucket).
func (s TokenBucket) Expires(p Params) int64 {
	if s.Last == 0 {
		return 0
	}
	return s.Last + ceilDiv(p.Burst*p.Window-s.tokens(p), p.Limit)
}

// Refund puts n tokens back, never above Burst. The decision is the peek
// after it, always Allowed: a refund cannot be denied.
func (s TokenBucket) Refund(p Params, now, n int64) (TokenBucket, Decision) {
	if s.Last != 0 {
		tokens := s.level(p, now)
		s = TokenBucket{Tokens: min(tokens+n*p.Window, p.Burst*p.Window), Last: now, Window: p.Window}
		if s.Expires(p) <= now {
			s = TokenBucket{} // full: absent, as a store drops it
		}
	}
	_, d := s.Decide(p, now, 0, 0)
	d.Allowed, d.RetryAfter = true, 0
	return s, d
}

// Newest returns the time of the newest write to s.
func (s TokenBucket) Newest() int64 { return s.Last }

// Book evaluates a booking of cost (>= 1) at now that may wait up to
// mostWait µs (OpBook, book.go), GCRA.Book's rule in tokens: when the
// cost is in the bucket beside the class's Reserve it is Decide's spend, Delay 0; otherwise, when
// the rate refills what is missing within mostWait, the cost is taken
// all the same (the level goes below empty by the units booked ahead)
// and the decision is admitted with that refill time as its Delay and
// Remaining 0; beyond, it is Decide's denial and s is kept. A bucket
// written under another window starts from its whole tokens, at most
// full and at least empty (tokens), as GCRA reschedules at most Burst
// outstanding units, so the two agree.
func (s TokenBucket) Book(p Params, now, cost, mostWait int64) (TokenBucket, Decision) {
	full := p.Burst * p.Window
	level := s.level(p, now)
	need, reserved := cost*p.Window, int64(p.Reserve)*p.Window // the Reserve kept for a more important class, as in Decide
	d := Decision{Limit: p.Burst}
	if level-reserved < need {
		wait := ceilDiv(need-(level-reserved), p.Limit)
		if wait > mostWait {
			d.Remaining = max(level-reserved, 0) / p.Window
			d.RetryAfter = wait
			d.ResetAfter = ceilDiv(full-level, p.Limit)
			return s, d
		}
		d.Delay = wait
	}
	level -= need
	s = TokenBucket{Tokens: level, Last: now, Window: p.Window}
	d.Allowed = true
	d.Remaining = max(level-reserved, 0) / p.Window
	d.ResetAfter = ceilDiv(full-level, p.Limit)
	return s, d
}
