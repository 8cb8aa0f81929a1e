package envoyrlqs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Phase is where a bucket stands at a Proxy.
type Phase string

// The phases of a bucket.
const (
	Unknown    Phase = "unknown"    // never matched, or abandoned
	Unassigned Phase = "unassigned" // NoAssignment in force
	Assignment Phase = "assignment" // an assignment in force, until ExpiresAt
	Fallback   Phase = "fallback"   // Expired.Fallback in force, until ExpiresAt
)

// State is a bucket's state at a Proxy, now.
type State struct {
	Phase     Phase
	Strategy  *typev3.RateLimitStrategy // in force; NoAssignment's when Unassigned
	Tokens    float64                   // a token bucket's tokens now; 0 otherwise
	ExpiresAt time.Duration             // Assignment, Fallback: when the timer runs out
}

// State returns bucket id's state now, after applying what arrived.
func (p *Proxy) State(id map[string]string) State {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drain()
	b := p.buckets[Key(id)]
	switch {
	case b == nil:
		return State{Phase: Unknown}
	case b.falling:
		return State{Phase: Fallback, Strategy: clone(b.cached), Tokens: p.tokens(b), ExpiresAt: b.fallback}
	case b.cached != nil:
		return State{Phase: Assignment, Strategy: clone(b.cached), Tokens: p.tokens(b), ExpiresAt: b.expireAt}
	}
	return State{Phase: Unassigned, Strategy: clone(p.def)}
}

// Events returns every change of every bucket so far, in order.
func (p *Proxy) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drain()
	return slices.Clone(p.events)
}

// Counts returns bucket id's decisions at this Proxy so far.
func (p *Proxy) Counts(id map[string]string) Counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.counts[Key(id)]; c != nil {
		return *c
	}
	return Counts{}
}

// Admissions returns the virtual times of bucket id's admissions here.
func (p *Proxy) Admissions(id map[string]string) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.admitted[Key(id)])
}

// Buckets returns how many buckets the Proxy holds now.
func (p *Proxy) Buckets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drain()
	return len(p.buckets)
}

// Streams returns how many streams the Proxy has opened, and the virtual
// times at which streams ended (server's end, a cut, a broken link).
func (p *Proxy) Streams() (opened int, ends []time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drain()
	return p.streams, slices.Clone(p.ends)
}

// Cut ends the current stream from the Proxy's side, as a broken link
// would: the buckets keep their assignments until their TTLs, and the next
// periodic report opens a new stream.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drain()
	if p.stream != nil {
		p.stream.cancel()
		p.stream = nil
		p.ends = append(p.ends, p.now)
	}
}

// Close ends the stream and the connection and waits for the receive
// goroutines. The Proxy opens no stream after it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	if p.stream != nil {
		p.stream.cancel()
		p.stream = nil
		p.ends = append(p.ends, p.now)
	}
	conn := p.conn
	p.mu.Unlock()
	err := conn.Close()
	p.wg.Wait()
	return err
}

// Fleet is N Proxies on one virtual clock, each to its own address (the
// same address for several is fine).
type Fleet struct {
	Proxies []*Proxy
}

// NewFleet dials one Proxy per address, with the same options.
func NewFleet(addrs []string, opts Options) (*Fleet, error) {
	f := &Fleet{}
	for _, a := range addrs {
		p, err := Dial(a, opts)
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		f.Proxies = append(f.Proxies, p)
	}
	return f, nil
}

// Advance moves every Proxy's clock d forward.
func (f *Fleet) Advance(d time.Duration) {
	for _, p := range f.Proxies {
		p.Advance(d)
	}
}

// Await awaits every Proxy's reports (Proxy.Await), each in turn.
func (f *Fleet) Await(ctx context.Context) error {
	var errs []error
	for i, p := range f.Proxies {
		if err := p.Await(ctx); err != nil {
			errs = append(errs, fmt.Errorf("proxy %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// Admitted returns how many requests of bucket id the fleet admitted at
// virtual times in [from, to].
func (f *Fleet) Admitted(id map[string]string, from, to time.Duration) int {
	n := 0
	for _, t := range f.times(id) {
		if t >= from && t <= to {
			n++
		}
	}
	return n
}

// MostAdmitted returns the most requests of bucket id the fleet admitted
// in any closed virtual interval [t, t+window], and the t of one such
// interval: what the fleet bound caps.
func (f *Fleet) MostAdmitted(id map[string]string, window time.Duration) (most int, at time.Duration) {
	ts := f.times(id)
	j := 0
	for i := range ts {
		if j < i {
			j = i
		}
		for j+1 < len(ts) && ts[j+1] <= ts[i]+window {
			j++
		}
		if n := j - i + 1; n > most {
			most, at = n, ts[i]
		}
	}
	return most, at
}

// times returns the fleet's admission times of id, sorted.
func (f *Fleet) times(id map[string]string) []time.Duration {
	var ts []time.Duration
	for _, p := range f.Proxies {
		ts = append(ts, p.Admissions(id)...)
	}
	slices.Sort(ts)
	return ts
}

// Close closes every Proxy.
func (f *Fleet) Close() error {
	var errs []error
	for _, p := range f.Proxies {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
