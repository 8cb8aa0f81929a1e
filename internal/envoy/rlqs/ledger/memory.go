package ledger

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Memory is the ledger of one process: the embedded store's, where one
// instance is the whole fleet. Safe for concurrent use.
type Memory struct {
	now func() time.Time

	mu      sync.Mutex
	domains map[string]*memDomain
}

// memDomain holds one domain's buckets, swept of expired entries at most
// once per ttl so a bucket no instance claims again does not stay.
type memDomain struct {
	buckets map[string][]entry
	swept   int64 // µs
}

var _ Ledger = (*Memory)(nil)

// NewMemory returns an empty Memory ledger reading the time from now.
func NewMemory(now func() time.Time) *Memory {
	return &Memory{now: now, domains: make(map[string]*memDomain)}
}

// Claim implements Ledger.
func (m *Memory) Claim(_ context.Context, domain, instance string, cs []Claim, ttl time.Duration) ([]Grant, error) {
	if len(cs) > MaxClaims {
		return nil, fmt.Errorf("rlqs ledger: claim: %d claims: at most %d a call", len(cs), MaxClaims)
	}
	now, t := m.now().UnixMicro(), ttl.Microseconds()
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.domains[domain]
	if d == nil {
		d = &memDomain{buckets: make(map[string][]entry), swept: now}
		m.domains[domain] = d
	}
	gs := make([]Grant, len(cs))
	for i, c := range cs {
		var es []entry
		gs[i], es = claim(now, t, instance, c, d.buckets[c.Bucket])
		d.put(c.Bucket, es)
	}
	if now-d.swept >= t {
		d.sweep(now)
	}
	return gs, nil
}

// Release implements Ledger.
func (m *Memory) Release(_ context.Context, domain, instance string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.domains[domain]
	if d == nil {
		return nil
	}
	for b, es := range d.buckets {
		kept := es[:0]
		for _, e := range es {
			if e.instance != instance {
				kept = append(kept, e)
			}
		}
		d.put(b, kept)
	}
	return nil
}

func (d *memDomain) put(bucket string, es []entry) {
	if len(es) == 0 {
		delete(d.buckets, bucket)
		return
	}
	d.buckets[bucket] = es
}

func (d *memDomain) sweep(now int64) {
	for b, es := range d.buckets {
		kept := es[:0]
		for _, e := range es {
			if e.expires > now {
				kept = append(kept, e)
			}
		}
		d.put(b, kept)
	}
	d.swept = now
}
