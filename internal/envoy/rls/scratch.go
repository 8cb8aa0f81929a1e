package rls

import (
	"sync"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/envoy/rules"
)

// The memory of one request. BenchmarkShouldRateLimit's memory profile
// counted some twenty allocations of the service's own per call, each a
// small object the collector then traced: the descriptors, groups and
// buffers of matching, which live only while the request is decided,
// now come from a pool (scratch); the answer and the messages it points
// to, which gRPC marshals after the handler returns and so are never
// pooled, are allocated together (reply).

// scratch is what one request works in, taken from scratchPool and given
// back, cleared, when the request is answered. Nothing in it outlives
// the request: the answer points into its reply, never into scratch.
type scratch struct {
	ds      []descriptor
	groups  []*group
	gbuf    []group // the groups' storage, at most one per descriptor
	entries []rules.Entry
	vars    []rules.Entry
	id      []byte // a descriptor's identity, framed
	rp      *reply // the answer being built; not pooled
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Bounds of what a scratch keeps between requests: one that served a
// larger request (MaxDescriptors or MaxEntries raised, long values) is
// left to the collector rather than kept at that size.
const (
	keepDescriptors = DefaultMaxDescriptors
	keepEntries     = DefaultMaxEntries
	keepIdentity    = 4 << 10
)

// getScratch returns a cleared scratch for a request of n descriptors.
func getScratch(n int) *scratch {
	sc := scratchPool.Get().(*scratch)
	if cap(sc.ds) < n {
		sc.ds = make([]descriptor, n)
	}
	sc.ds = sc.ds[:n]
	if cap(sc.gbuf) < n {
		sc.gbuf = make([]group, 0, n)
	}
	sc.rp = newReply(n)
	return sc
}

// release gives sc back to the pool, cleared, unless it grew past the
// bounds.
func (sc *scratch) release() {
	if sc.reset() {
		scratchPool.Put(sc)
	}
}

// reset clears sc, so that no request sees another's descriptors and the
// collector is not kept from what they pointed to, and reports whether
// sc is within the bounds of what the pool keeps.
func (sc *scratch) reset() bool {
	clear(sc.ds)
	for i := range sc.gbuf {
		sc.gbuf[i] = group{members: sc.gbuf[i].members[:0]}
	}
	clear(sc.groups)
	clear(sc.entries[:cap(sc.entries)])
	clear(sc.vars[:cap(sc.vars)])
	sc.ds, sc.groups, sc.gbuf = sc.ds[:0], sc.groups[:0], sc.gbuf[:0]
	sc.entries, sc.vars, sc.id, sc.rp = sc.entries[:0], sc.vars[:0], sc.id[:0], nil
	return cap(sc.ds) <= keepDescriptors && cap(sc.entries) <= keepEntries && cap(sc.vars) <= keepEntries && cap(sc.id) <= keepIdentity
}

// newGroup returns a cleared group from sc's storage (one of its own
// when the storage is used up), its members' buffer kept.
func (sc *scratch) newGroup() *group {
	if len(sc.gbuf) == cap(sc.gbuf) {
		return new(group)
	}
	sc.gbuf = sc.gbuf[:len(sc.gbuf)+1]
	return &sc.gbuf[len(sc.gbuf)-1]
}

// reply is the answer to one request with the descriptor statuses and
// the messages they point to: for a request of one descriptor (Envoy's
// usual) all in one allocation, the header values included.
type reply struct {
	resp     rlspb.RateLimitResponse
	statuses [1]*rlspb.RateLimitResponse_DescriptorStatus
	one      [1]slot
	slots    []slot // handed out in order; one[:] for one descriptor
	headers  [3]*corepb.HeaderValue
	header   [3]corepb.HeaderValue
}

// slot is one descriptor status and what it points to.
type slot struct {
	status rlspb.RateLimitResponse_DescriptorStatus
	limit  rlspb.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// newReply returns the reply of a request of n descriptors: statuses for
// n, and a slot for each (one status per descriptor is the rule; a
// status past them is allocated alone).
func newReply(n int) *reply {
	rp := &reply{}
	if n == 1 {
		rp.slots, rp.resp.Statuses = rp.one[:], rp.statuses[:]
	} else {
		rp.slots, rp.resp.Statuses = make([]slot, n), make([]*rlspb.RateLimitResponse_DescriptorStatus, n)
	}
	return rp
}

// status returns the slot of a new descriptor status of code; with r,
// carrying r's current_limit.
func (rp *reply) status(code rlspb.RateLimitResponse_Code, r *rules.Rule) *slot {
	var sl *slot
	if len(rp.slots) > 0 {
		sl, rp.slots = &rp.slots[0], rp.slots[1:]
	} else {
		sl = new(slot)
	}
	sl.status.Code = code
	if r != nil {
		sl.limit.Name, sl.limit.RequestsPerUnit, sl.limit.Unit = r.Name, uint32(r.RequestsPerUnit), rlspb.RateLimitResponse_RateLimit_Unit(r.Unit)
		sl.status.CurrentLimit = &sl.limit
	}
	return sl
}

// untilReset sets the status's duration_until_reset to d, as
// durationpb.New(d) makes it.
func (sl *slot) untilReset(d time.Duration) {
	nanos := d.Nanoseconds()
	secs := nanos / 1e9
	sl.reset.Seconds, sl.reset.Nanos = secs, int32(nanos-secs*1e9)
	sl.status.DurationUntilReset = &sl.reset
}
