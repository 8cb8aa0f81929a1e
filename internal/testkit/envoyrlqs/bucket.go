package envoyrlqs

import (
	"encoding/json"
	"math"
	"sort"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// minFillRate is Envoy's floor on a token bucket's fill rate: one token a
// year (token_bucket_impl.cc, kMinFillRate).
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// limiter is Envoy's AtomicTokenBucketImpl as the filter builds it
// (global_client_impl.cc, createTokenBucketFromAction), in float64 as
// Envoy's doubles: the bucket holds min(max, (now − tin)·rate) tokens, and
// a request takes one by moving tin forward.
type limiter struct {
	max       float64
	rate      float64 // tokens per second
	tin       float64 // seconds of virtual time
	unlimited bool    // fill_interval under 1 s: Envoy divides by 0 s and holds max_tokens always
}

// fillSeconds reads a fill interval as Envoy does (absl::ToInt64Seconds
// of seconds + nanos): whole seconds, truncated toward zero.
func fillSeconds(d *durationpb.Duration) int64 {
	return (d.GetSeconds()*1e9 + int64(d.GetNanos())) / 1e9
}

// newLimiter builds the limiter of tb at now (seconds). A bucket that
// replaces old starts at old's fill ratio, rounded down to whole tokens;
// without old it starts full.
func newLimiter(tb *typev3.TokenBucket, now float64, old *limiter) *limiter {
	l := &limiter{max: float64(tb.GetMaxTokens())}
	fis := fillSeconds(tb.GetFillInterval())
	if fis <= 0 {
		l.unlimited = true
		return l
	}
	l.rate = math.Max(float64(tb.GetTokensPerFill().GetValue())/float64(fis), minFillRate)
	initial := l.max
	if old != nil {
		initial = 0
		if old.max > 0 {
			initial = math.Floor(l.max * (old.tokens(now) / old.max))
		}
	}
	l.tin = now
	if initial > 0 {
		l.tin -= initial / l.rate
	}
	return l
}

// tokens returns what the bucket holds at now.
func (l *limiter) tokens(now float64) float64 {
	if l.unlimited {
		return l.max
	}
	return math.Min(l.max, (now-l.tin)*l.rate)
}

// consume takes one token at now, if the bucket holds one.
func (l *limiter) consume(now float64) bool {
	total := l.tokens(now)
	if total < 1 {
		return false
	}
	if !l.unlimited {
		l.tin = now - (total-1)/l.rate
	}
	return true
}

// sameTokenBucket is Envoy's protoTokenBucketsEq: max_tokens,
// tokens_per_fill and the nanos of fill_interval — not its seconds, so two
// buckets that differ only in whole seconds of fill_interval are the same
// to Envoy, which keeps the limiter it has (our reading of
// global_client_impl.cc; docs/rlqs.md says what a server must do about it).
func sameTokenBucket(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// shouldReplace is Envoy's shouldReplaceTokenBucket: a token bucket s
// replaces the limiter unless the cached action is a token bucket equal
// to it.
func shouldReplace(cached, s *typev3.RateLimitStrategy) bool {
	return cached.GetTokenBucket() == nil || !sameTokenBucket(s.GetTokenBucket(), cached.GetTokenBucket())
}

// bucket is one bucket of Envoy's bucket cache (CachedBucket): its usage
// since the last report and the action in force.
type bucket struct {
	id         map[string]string
	key        string
	allowed    uint64 // since the last report
	denied     uint64
	lastReport time.Duration
	cached     *typev3.RateLimitStrategy // the assignment or fallback in force; nil: the default (no_assignment_behavior)
	lim        *limiter
	expiring   bool // the assignment's TTL timer runs, to expireAt
	expireAt   time.Duration
	falling    bool // the fallback's timer runs, to fallbackEnd
	fallback   time.Duration
}

// allows is Envoy's shouldAllowRequest (filter.cc): the cached action, or
// the default one, decides; requests_per_time_unit and an unset strategy
// allow.
func (b *bucket) allows(def *typev3.RateLimitStrategy, now float64) bool {
	s := b.cached
	if s == nil {
		s = def
	}
	switch {
	case s.GetStrategy() == nil:
		return true
	case s.GetTokenBucket() != nil:
		return b.lim.consume(now)
	case isBlanket(s):
		return s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL
	}
	return true // requests_per_time_unit: Envoy logs "not yet supported" and allows
}

// isBlanket reports whether s is a blanket rule.
func isBlanket(s *typev3.RateLimitStrategy) bool {
	_, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	return ok
}

// usage takes the bucket's usage for a report at now, as Envoy's
// getUsageFromBucket: counts since the last report (then zeroed) and
// time_elapsed in whole seconds since it, truncated (0 on a new bucket's
// first report).
func (b *bucket) usage(now time.Duration) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	u := &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           &rlqspb.BucketId{Bucket: copyID(b.id)},
		NumRequestsAllowed: b.allowed,
		NumRequestsDenied:  b.denied,
	}
	u.TimeElapsed = &durationpb.Duration{Seconds: int64((now - b.lastReport) / time.Second)}
	b.allowed, b.denied, b.lastReport = 0, 0, now
	return u
}

// Key is the canonical form of a bucket id (keys sorted), by which the kit
// files buckets: two maps with the same pairs have the same Key.
func Key(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pairs := make([][2]string, len(keys))
	for i, k := range keys {
		pairs[i] = [2]string{k, id[k]}
	}
	out, _ := json.Marshal(pairs) // a slice of string pairs always encodes
	return string(out)
}

// copyID returns a copy of id.
func copyID(id map[string]string) map[string]string {
	c := make(map[string]string, len(id))
	for k, v := range id {
		c[k] = v
	}
	return c
}

// clone returns a deep copy of s (nil stays nil).
func clone(s *typev3.RateLimitStrategy) *typev3.RateLimitStrategy {
	if s == nil {
		return nil
	}
	return proto.Clone(s).(*typev3.RateLimitStrategy)
}
