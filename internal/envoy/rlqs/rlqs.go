// Package rlqs is Envoy's rate-limit quota service (RLQS v3,
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService): it divides each
// bucket's policy among the Envoy streams that report the bucket, by their
// demand, and, through a ledger, among the sluice instances those streams
// reach (RLQS-DESIGN.md; docs/rlqs.md states and proves the bound).
//
// One phase a file: split.go is the split's arithmetic (pure), buckets.go
// the config and the matching of bucket ids, stream.go the streams and
// their reports, mailbox.go a stream's answers on their way, round.go
// the split rounds and the ledger, shutdown.go the shutdown, metrics.go
// and view.go what operators see.
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoy/rlqs/ledger"
	"github.com/sluicehq/sluice/internal/logthrottle"
	"github.com/sluicehq/sluice/subject"
)

// SubjectKind is the kind folded into every bucket's pseudonym, with the
// bucket id's sorted entries and the domain.
const SubjectKind = "rlqs"

// Subject is the subject of the bucket id id of domain, as the service
// names it and plans name it: the pseudonym of the domain and the
// sorted entries.
func Subject(p *subject.Pseudonymizer, domain string, id map[string]string) string {
	return pseudonym(p, domain, identity(id))
}

// pseudonym is Subject of a bucket whose identity is already known.
func pseudonym(p *subject.Pseudonymizer, domain, identity string) string {
	return p.Pseudonym(SubjectKind, identity, domain)
}

// Options configure a Service. Pseudonymizer, Clock and Logger are
// required.
type Options struct {
	// Ledger records what this instance reserved of each bucket. Default
	// (nil): ledger.NewMemory on Clock, for one instance alone.
	Ledger ledger.Ledger
	// Redis, when set and Ledger is nil, keeps the ledger in Redis, so
	// every instance on it divides the same limits (docs/rlqs.md,
	// "Redis"). Default: nil.
	Redis redis.UniversalClient
	// Pseudonymizer makes each bucket's subject. Required.
	Pseudonymizer *subject.Pseudonymizer
	// Overrides returns the tenant plans; one naming a matcher's policy and
	// a bucket's subject replaces the bucket's numbers. Read at most once a
	// round. Default: nil, no plans.
	Overrides func(ctx context.Context) ([]sluice.Override, error)
	// Clock is read for every time. Required.
	Clock sluice.Clock
	// Logger receives warnings (ledger outages, slow streams). Required.
	Logger *slog.Logger
	// Metrics, when set, counts and gauges the buckets. Default: nil.
	Metrics *Metrics

	manual  bool                                 // no ticker: tests call round themselves
	left    func()                               // called when a stream has left (tests)
	after   func(time.Duration) <-chan time.Time // default time.After (tests wait on their own)
	sending func()                               // called as a stream's writer begins a send (tests)
}

// Service is the RLQS service. Safe for concurrent use. It owns one
// goroutine (the rounds' ticker) and one writer per stream; Shutdown
// ends them.
type Service struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	cfg      atomic.Pointer[config]
	opts     Options
	ledger   ledger.Ledger
	instance string
	plans    atomic.Pointer[map[planKey]sluice.Override]
	planLog  logthrottle.Throttle

	mu      sync.Mutex
	domains map[string]*domain
	all     map[*stream]bool // every stream served
	closing bool
	ending  atomic.Bool // Shutdown began: reports are no longer answered

	stop, done chan struct{}
	streams    sync.WaitGroup // handlers running
}

// New returns a Service splitting cfg, its rounds running until Shutdown.
func New(cfg Config, opts Options) (*Service, error) {
	switch {
	case opts.Pseudonymizer == nil:
		return nil, errors.New("rlqs: New: pseudonymizer is nil")
	case opts.Clock == nil:
		return nil, errors.New("rlqs: New: clock is nil")
	case opts.Logger == nil:
		return nil, errors.New("rlqs: New: logger is nil")
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Service{opts: opts, ledger: opts.Ledger, instance: hex.EncodeToString(id[:]),
		domains: map[string]*domain{}, all: map[*stream]bool{}, stop: make(chan struct{}), done: make(chan struct{}),
		planLog: logthrottle.Throttle{Every: time.Minute, Burst: 1}}
	switch {
	case s.ledger == nil && opts.Redis != nil:
		// The store's keys' prefix: sluice serve's, the default.
		r, err := ledger.NewRedis(opts.Redis, "")
		if err != nil {
			return nil, err
		}
		s.ledger = r
	case s.ledger == nil:
		s.ledger = ledger.NewMemory(opts.Clock.Now)
	}
	if err := s.Swap(cfg); err != nil {
		return nil, err
	}
	// The plans before the first report, so a planned bucket's first
	// answer has its plan's numbers, not the policy's.
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Load().Round)
	s.readPlans(ctx)
	cancel()
	if opts.manual {
		close(s.done)
	} else {
		go s.tick()
	}
	return s, nil
}

// Register registers the service on g.
func (s *Service) Register(g *grpc.Server) { rlqspb.RegisterRateLimitQuotaServiceServer(g, s) }

// Swap makes cfg the config of every report and round from now on:
// buckets whose matcher now names another policy are split by it at the
// next round; buckets no matcher matches any more are let go (their
// streams hear ALLOW_ALL at their next report).
func (s *Service) Swap(cfg Config) error {
	c, err := compile(cfg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range c.domains {
		if s.domains[name] == nil {
			s.domains[name] = newDomain(name)
		}
	}
	s.cfg.Store(c)
	return nil
}

// domainList returns the domains, in no order.
func (s *Service) domainList() []*domain {
	s.mu.Lock()
	defer s.mu.Unlock()
	ds := make([]*domain, 0, len(s.domains))
	for _, d := range s.domains {
		ds = append(ds, d)
	}
	return ds
}

// tick runs a round every Config.Round until Shutdown.
func (s *Service) tick() {
	defer close(s.done)
	every := s.cfg.Load().Round
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		s.round(ctx)
		cancel()
		if r := s.cfg.Load().Round; r != every {
			every = r
			t.Reset(every)
		}
	}
}
