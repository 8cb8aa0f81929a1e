package envoyrlqs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Options configure a Proxy as a rate_limit_quota filter's settings
// configure Envoy. The zero value is not usable: Domain is required.
type Options struct {
	// Domain is the filter's domain, carried by every report. Required.
	Domain string
	// ReportPeriod is how often every bucket is reported. Default: 5s,
	// what Envoy uses whatever reporting_interval says.
	ReportPeriod time.Duration
	// NoAssignment is no_assignment_behavior's fallback_rate_limit, in
	// force before a bucket's first assignment, after an expiry without
	// Expired, and after Expired's Timeout: a blanket rule (or
	// requests_per_time_unit, which allows). A token bucket is refused:
	// Envoy builds no limiter for it. Default: ALLOW_ALL.
	NoAssignment *typev3.RateLimitStrategy
	// Expired is expired_assignment_behavior with a fallback_rate_limit.
	// Default: none, and an expired assignment gives way to NoAssignment
	// at once (as Envoy also does for reuse_last_assignment).
	Expired *Expired
}

// Expired is expired_assignment_behavior with a fallback_rate_limit.
type Expired struct {
	// Fallback is the strategy in force from an assignment's expiry until
	// a new assignment or Timeout. Required.
	Fallback *typev3.RateLimitStrategy
	// Timeout is expired_assignment_behavior_timeout, read in whole
	// seconds as Envoy reads it; then NoAssignment applies. 0 ends the
	// fallback at once (Envoy reads an unset timeout as 0 too).
	Timeout time.Duration
}

// EventKind says what happened to a bucket.
type EventKind string

// The kinds of Event.
const (
	Assigned          EventKind = "assigned"       // a strategy applied (a token bucket: a new limiter)
	Refreshed         EventKind = "refreshed"      // the same token bucket again: limiter kept, TTL restarted
	Abandoned         EventKind = "abandoned"      // abandon_action: the bucket erased
	AssignmentExpired EventKind = "expired"        // the TTL ran out: the fallback, or NoAssignment
	FallbackEnded     EventKind = "fallback_ended" // Expired.Timeout ran out: NoAssignment
	Ignored           EventKind = "ignored"        // an action Envoy skips: unknown bucket, no id, requests_per_time_unit, no strategy
)

// Event is one change of a bucket, at a virtual time: each action of a
// response as applied, each expiry. TokensBefore and TokensAfter are the
// bucket's tokens just before and after (0 without a token bucket), so a
// token bucket's jump (a new one starts full; a changed one keeps its
// fill ratio) is TokensAfter − TokensBefore.
type Event struct {
	At       time.Duration
	Key      string
	Kind     EventKind
	Strategy *typev3.RateLimitStrategy // in force after the event; nil: NoAssignment
	TTL      time.Duration             // Assigned, Refreshed: the TTL as Envoy reads it (whole seconds)

	TokensBefore, TokensAfter float64
}

// Counts are a bucket's admissions at one Proxy, since it was first seen.
type Counts struct{ Allowed, Denied uint64 }

// Proxy is one Envoy with the rate_limit_quota filter, as we read it
// (docs/rlqs.md): one RLQS stream to a server, a bucket cache, and a
// virtual clock that only Advance moves. Responses arrive on a receive
// goroutine and are applied, at the virtual time of the moment, when the
// test next calls into the Proxy. A Proxy is safe for concurrent use; its
// goroutines stop on Close, which waits for them.
type Proxy struct {
	opts   Options
	def    *typev3.RateLimitStrategy
	conn   *grpc.ClientConn
	client rlqspb.RateLimitQuotaServiceClient
	in     *inbox
	wg     sync.WaitGroup

	mu       sync.Mutex
	now      time.Duration
	buckets  map[string]*bucket
	timerOn  bool // the report timer runs (from the first bucket on)
	reportAt time.Duration
	stream   *stream // nil: none open
	streams  int
	ends     []time.Duration
	pending  []pend
	events   []Event
	admitted map[string][]time.Duration
	counts   map[string]*Counts
	closed   bool
}

// Dial returns a Proxy that will report to the RLQS server at addr (a
// loopback host:port). As Envoy, it opens its stream when the first
// request matches a bucket.
func Dial(addr string, opts Options) (*Proxy, error) {
	if opts.Domain == "" {
		return nil, errors.New("envoyrlqs: Options.Domain: must not be empty")
	}
	if opts.ReportPeriod < 0 || opts.ReportPeriod%time.Second != 0 {
		return nil, fmt.Errorf("envoyrlqs: Options.ReportPeriod: %v: must be whole seconds", opts.ReportPeriod)
	}
	if opts.ReportPeriod == 0 {
		opts.ReportPeriod = 5 * time.Second
	}
	if opts.NoAssignment.GetTokenBucket() != nil {
		return nil, errors.New("envoyrlqs: Options.NoAssignment: a token bucket: Envoy builds no limiter for no_assignment_behavior")
	}
	if opts.Expired != nil && opts.Expired.Fallback.GetStrategy() == nil {
		return nil, errors.New("envoyrlqs: Options.Expired.Fallback: must be set")
	}
	def := clone(opts.NoAssignment)
	if def == nil {
		def = AllowAll()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("envoyrlqs: dial %s: %w", addr, err)
	}
	return &Proxy{
		opts: opts, def: def, conn: conn, client: rlqspb.NewRateLimitQuotaServiceClient(conn), in: newInbox(),
		buckets: map[string]*bucket{}, admitted: map[string][]time.Duration{}, counts: map[string]*Counts{},
	}, nil
}

// AllowAll is the blanket rule ALLOW_ALL.
func AllowAll() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
}

// DenyAll is the blanket rule DENY_ALL.
func DenyAll() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
}

// TokenBucket is a token-bucket strategy as a server sends it.
func TokenBucket(maxTokens, tokensPerFill uint32, fillInterval time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: maxTokens, TokensPerFill: wrapperspb.UInt32(tokensPerFill), FillInterval: durationpb.New(fillInterval),
	}}}
}

// Admit decides one request matched into bucket id at the current virtual
// time, as the filter does: a new bucket is decided by NoAssignment (only
// DENY_ALL denies), created, and reported at once; a known one by the
// strategy in force.
func (p *Proxy) Admit(id map[string]string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drain()
	key := Key(id)
	b := p.buckets[key]
	var ok bool
	if b == nil {
		ok = !(isBlanket(p.def) && p.def.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL)
		b = &bucket{id: copyID(id), key: key, lastReport: p.now}
		p.buckets[key] = b
		p.count(b, key, ok)
		p.created(b)
	} else {
		ok = b.allows(p.def, p.seconds())
		p.count(b, key, ok)
	}
	return ok
}

// count files one decision.
func (p *Proxy) count(b *bucket, key string, ok bool) {
	c := p.counts[key]
	if c == nil {
		c = &Counts{}
		p.counts[key] = c
	}
	if ok {
		b.allowed++
		c.Allowed++
		p.admitted[key] = append(p.admitted[key], p.now)
		return
	}
	b.denied++
	c.Denied++
}

// created is Envoy's createBucketImpl after the cache entry: the first
// bucket ever starts the report timer and the stream; every new bucket is
// reported at once (lost, as in Envoy, when no stream is open).
func (p *Proxy) created(b *bucket) {
	if !p.timerOn {
		p.timerOn = true
		p.reportAt = p.now + p.opts.ReportPeriod
		p.open()
	}
	p.send([]*bucket{b})
}

// Advance moves the virtual clock d forward, firing on the way, at their
// virtual times, the timers falling due: assignment expiries, fallback
// ends, and the periodic report. Responses that arrive meanwhile are
// applied at the next call: step by at most a report period and Await the
// answers where the test needs them.
func (p *Proxy) Advance(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drain()
	end := p.now + d
	for {
		t, ok := p.nextTimer()
		if !ok || t > end {
			break
		}
		p.now = t
		p.fire()
	}
	p.now = end
}

// Now returns the virtual time since Dial.
func (p *Proxy) Now() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.now
}

// Report sends a report of every bucket now, as the timer would (a test
// convenience: Envoy reports only on its timer and for new buckets). The
// timer keeps its schedule.
func (p *Proxy) Report() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drain()
	p.reportAll()
}

// nextTimer returns the earliest running timer.
func (p *Proxy) nextTimer() (time.Duration, bool) {
	t, ok := p.reportAt, p.timerOn
	for _, b := range p.buckets {
		for _, c := range []struct {
			on bool
			at time.Duration
		}{{b.expiring, b.expireAt}, {b.falling, b.fallback}} {
			if c.on && (!ok || c.at < t) {
				t, ok = c.at, true
			}
		}
	}
	return t, ok
}

// fire runs the timers due at the current virtual time: each bucket's
// expiry then its fallback's end, then the periodic report.
func (p *Proxy) fire() {
	keys := make([]string, 0, len(p.buckets))
	for k, b := range p.buckets {
		if (b.expiring && b.expireAt <= p.now) || (b.falling && b.fallback <= p.now) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		b := p.buckets[k]
		if b.expiring && b.expireAt <= p.now {
			p.expire(b)
		}
		if b.falling && b.fallback <= p.now {
			p.endFallback(b)
		}
	}
	if p.timerOn && p.reportAt <= p.now {
		p.reportAll()
		p.reportAt += p.opts.ReportPeriod
	}
}

// reportAll is Envoy's onSendReportsTimer: every bucket's usage is taken
// (and zeroed) first; with no stream open it tries to open one, and the
// report is lost if that fails.
func (p *Proxy) reportAll() {
	bs := make([]*bucket, 0, len(p.buckets))
	for _, b := range p.buckets {
		bs = append(bs, b)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].key < bs[j].key })
	if p.stream == nil {
		p.open()
	}
	p.send(bs)
}

// send reports bs on the open stream; with none, their usage is lost.
func (p *Proxy) send(bs []*bucket) {
	msg := &rlqspb.RateLimitQuotaUsageReports{Domain: p.opts.Domain}
	for _, b := range bs {
		msg.BucketQuotaUsages = append(msg.BucketQuotaUsages, b.usage(p.now))
	}
	if p.stream == nil {
		return
	}
	p.in.mu.Lock()
	seq := p.in.seq
	p.in.mu.Unlock()
	if err := p.stream.cs.Send(msg); err != nil {
		return // the stream broke: its end reaches the inbox through Recv
	}
	for _, b := range bs {
		p.pending = append(p.pending, pend{key: b.key, seq: seq, s: p.stream})
	}
}

// open starts a stream and its receive goroutine.
func (p *Proxy) open() {
	if p.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := p.client.StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		return
	}
	s := &stream{cs: cs, cancel: cancel}
	p.stream = s
	p.streams++
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		receive(p.in, s)
	}()
}

// seconds is the virtual time in seconds, the limiters' time.
func (p *Proxy) seconds() float64 { return p.now.Seconds() }
