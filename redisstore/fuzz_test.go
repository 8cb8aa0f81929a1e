package redisstore_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/evaluation"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// The layouts FuzzCorruptState writes its bytes in.
const (
	layoutRaw     = iota // the bytes as the stored string (a log's entries split at ',')
	layoutDoubles        // 8 bytes each: a field (or an entry) as IEEE bits, anything a double holds
	layoutNear           // 8 bytes each: an integer near what the script writes, by field
	layoutDecimal        // as layoutNear, stored in the older decimal form
	layouts
)

// fuzzFields names what each field of a fixed-size state holds, for
// layoutNear: a time, a count, tokens, a remainder, a limit, a window.
var fuzzFields = map[sluice.Algorithm]string{
	sluice.FixedWindow:   "tnt",
	sluice.SlidingWindow: "tnnt",
	sluice.TokenBucket:   "ktw",
	sluice.GCRA:          "tfLWt",
}

// fuzzMaxRegression is the caller store's MaxClockRegression.
const fuzzMaxRegression = time.Second

// FuzzCorruptState writes arbitrary bytes or entries as the state of one
// policy under the key the store uses, then decides on it, on a caller's
// clock (a run of spends at one instant) and on Redis's (one spend). Each
// decision is either refused as corrupt state, writing nothing, or
// answers 0 <= remaining <= limit, a retry wait exactly when denied, and
// waits no longer than the state can matter: the algorithm's span after
// its newest write, which lies at most the clock's tolerance ahead. Over
// the run, no more units are admitted than the policy's capacity. (On a
// caller's clock, a state written further ahead than MaxClockRegression
// is refused as clock unsafe instead.)
func FuzzCorruptState(f *testing.F) {
	c := standaloneClient(f)
	clock := sluicetest.NewClock()
	// Keys live an hour beyond what the fake clock needs: it does not
	// advance with Redis's, which expires them.
	caller := newStore(f, c, redisstore.Options{Clock: clock, MaxClockRegression: fuzzMaxRegression, ExtraTTL: time.Hour})
	server := newStore(f, c, redisstore.Options{})
	general := newStore(f, c, redisstore.Options{}) // every decision to it in the general form (fuzzRun.general)
	// Every decision to batched in a decideAll call.
	batched := &redisstore.Driven{Store: newStore(f, c, redisstore.Options{}), Batched: true}
	ints := func(vs ...int64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
		return b
	}
	doubles := func(vs ...float64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
		return b
	}
	for kind := range uint8(len(fuzzAlgorithms)) {
		// Near what the script writes: offsets from now, small counts, the
		// policy's numbers (even) or others (odd).
		f.Add(kind, uint16(5), uint32(60_000), uint16(5), uint8(layoutNear), ints(0, 1, 0, 2, 0))
		f.Add(kind, uint16(3), uint32(1000), uint16(7), uint8(layoutDecimal), ints(-5, 3, -2, 4, -1))
		f.Add(kind, uint16(2), uint32(10), uint16(1), uint8(layoutNear), ints(7, 9, 11, 13, 15, 17))
	}
	for _, s := range []struct {
		kind   uint8
		layout uint8
		data   []byte
	}{
		{0, layoutDoubles, doubles(maxExact-1, 5, 1.7e15)},                // a window opening 228 years after its last write
		{0, layoutDoubles, doubles(1.7e15, math.Copysign(0, -1), 1.7e15)}, // -0
		{0, layoutDoubles, doubles(1.7e15, math.NaN(), 1.7e15)},
		{0, layoutRaw, []byte("12:3:4")},
		{1, layoutNear, ints(0, -3, -2, -1)}, // a log out of order
		{1, layoutRaw, []byte("5,4,3,2,1")},
		{1, layoutDoubles, doubles(1.5, 2)},
		{2, layoutDoubles, doubles(0, 1.5, 0, 1)},
		{3, layoutDoubles, doubles(math.Inf(1), 1, 1000)},
		{4, layoutNear, ints(1<<40, 0, 0, 0, 0)}, // a TAT far ahead
		{4, layoutRaw, []byte("\x01short")},
		{5, layoutNear, ints(1<<40, 0)}, // a lease expiring far ahead
		{5, layoutDoubles, doubles(1.5, 2.5)},
	} {
		f.Add(s.kind, uint16(5), uint32(60_000), uint16(5), s.layout, s.data)
	}
	f.Fuzz(func(t *testing.T, kind uint8, limit uint16, windowMs uint32, burst uint16, layout uint8, data []byte) {
		p := fuzzPolicy(t, kind, limit, windowMs, burst)
		layout %= layouts
		// A run of spends at one instant on the caller's clock.
		now := clockStart.Add(time.Duration(windowMs%1000) * time.Millisecond)
		clock.Set(now)
		fz := &fuzzRun{t: t, c: c, s: &redisstore.Driven{Store: caller}, p: p, subject: subject(t), caller: true, lag: fuzzMaxRegression.Microseconds()}
		fz.write(layout, data, now.UnixMicro())
		cost, units := max(1, fz.capacity()/4), int64(0)
		if p.Algorithm == sluice.Concurrency {
			cost = 1 // a lease holds one slot whatever the cost
		}
		for i := range int(2 + fz.capacity()/cost) {
			st, ok := fz.decide(cost, i)
			if !ok {
				break
			}
			if st.Allowed {
				units += cost
			}
		}
		if units > fz.capacity() {
			t.Fatalf("%s: %d units admitted at one instant, more than the capacity %d", fz, units, fz.capacity())
		}
		// One spend on Redis's clock, the state written around its time,
		// in the short form, alone and batched, and in the general one.
		for i, s := range []*redisstore.Driven{{Store: server}, {Store: general}, batched} {
			fz = &fuzzRun{t: t, c: c, s: s, p: p, general: s.Store == general, subject: fmt.Sprint(subject(t), ".", i), lag: p.Window.Microseconds() + p.CleanupGrace.Microseconds()}
			if p.Algorithm == sluice.Concurrency {
				fz.lag = p.LeaseTTL.Microseconds() + p.CleanupGrace.Microseconds()
			}
			fz.write(layout, data, time.Now().UnixMicro())
			fz.decide(1, 0)
		}
	})
}

var fuzzAlgorithms = append(slices.Clone(algorithms), sluice.Concurrency)

// fuzzPolicy returns a valid policy of algorithm kind with numbers drawn
// from limit, windowMs and burst: capacities up to 8, so that a run of
// spends stays short, windows of 1ms to 24h.
func fuzzPolicy(t *testing.T, kind uint8, limit uint16, windowMs uint32, burst uint16) *sluice.Policy {
	a := fuzzAlgorithms[int(kind)%len(fuzzAlgorithms)]
	w := time.Duration(1+windowMs%86_400_000) * time.Millisecond
	p := sluice.Policy{ID: "fuzz", Algorithm: a, Limit: 1 + int64(limit%8), Window: w}
	switch a {
	case sluice.Concurrency:
		p.Window, p.LeaseTTL = 0, w
	case sluice.TokenBucket, sluice.GCRA:
		p.Limit = 1 + int64(limit%1000)
		p.Burst = 1 + int64(burst%8)
	}
	p = evaluation.Defaults(p)
	if err := p.Validate(); err != nil {
		t.Fatalf("fuzzPolicy: %v", err)
	}
	return &p
}

// fuzzRun is one policy's state under one subject of one store, and the
// decisions on it.
type fuzzRun struct {
	t       *testing.T
	c       *redis.Client
	s       *redisstore.Driven
	p       *sluice.Policy
	general bool // every decision in the general form, else in the form the Limiter gives it
	subject string
	caller  bool  // on the caller's clock (else Redis's)
	lag     int64 // µs the newest write may lie ahead of a decision's time
	written string
}

func (fz *fuzzRun) String() string {
	return fmt.Sprintf("%v limit=%d burst=%d window=%v lease_ttl=%v over %q", fz.p.Algorithm, fz.p.Limit, fz.p.Burst, fz.p.Window, fz.p.LeaseTTL, fz.written)
}

func (fz *fuzzRun) capacity() int64 {
	if fz.p.Algorithm == sluice.TokenBucket || fz.p.Algorithm == sluice.GCRA {
		return fz.p.Burst
	}
	return fz.p.Limit
}

// span returns the longest, in µs, a decision's waits may be: how long a
// state can matter after its newest write, plus how far that write may
// lie ahead.
func (fz *fuzzRun) span() int64 {
	p := fz.p
	w := p.Window.Microseconds()
	switch p.Algorithm {
	case sluice.SlidingWindow:
		return fz.lag + 2*w
	case sluice.Concurrency:
		return fz.lag + p.LeaseTTL.Microseconds()
	case sluice.TokenBucket:
		return fz.lag + (p.Burst*w+p.Limit-1)/p.Limit
	case sluice.GCRA:
		// Scheduled under these numbers with any burst they allow: its
		// debt is below 2^53 µs / limit.
		return fz.lag + (p.Burst*w)/p.Limit + maxExact/p.Limit + 2
	}
	return fz.lag + w
}

// write stores data in layout as the state, around now (µs).
func (fz *fuzzRun) write(layout uint8, data []byte, now int64) {
	ctx := context.Background()
	key := fz.s.Key(fz.subject, fz.p)
	var err error
	switch a := fz.p.Algorithm; {
	case a == sluice.SlidingLog || a == sluice.Concurrency:
		entries := fz.entries(layout, data, now)
		if len(entries) == 0 {
			return
		}
		if a == sluice.SlidingLog {
			vals := make([]any, len(entries))
			for i, e := range entries {
				vals[i] = e
			}
			err = fz.c.RPush(ctx, key, vals...).Err()
		} else {
			zs := make([]redis.Z, 0, len(entries))
			for i, e := range entries {
				if v, perr := strconv.ParseFloat(e, 64); perr == nil && !math.IsNaN(v) {
					zs = append(zs, redis.Z{Score: v, Member: fmt.Sprint("l", i)})
				}
			}
			if len(zs) == 0 {
				return
			}
			err = fz.c.ZAdd(ctx, key, zs...).Err()
		}
		fz.written = strings.Join(entries, ",")
		if err == nil {
			err = fz.c.Expire(ctx, key, time.Hour).Err()
		}
	default:
		fz.written = fz.fields(layout, data, now)
		err = fz.c.Set(ctx, key, fz.written, time.Hour).Err()
	}
	if err != nil {
		fz.t.Fatalf("write %s: %v", fz, err)
	}
}

// near returns the integer v stands for in a field of type typ (see
// fuzzFields), around now.
func (fz *fuzzRun) near(typ byte, v uint64, now int64) int64 {
	p := fz.p
	w := max(p.Window.Microseconds(), p.LeaseTTL.Microseconds())
	switch typ {
	case 't':
		if v>>56 == 0x5a {
			return now + int64(v&(1<<52-1)) // now and then far ahead
		}
		return now + int64(v%uint64(3*w)) - 2*w
	case 'n':
		return int64(v % uint64(2*fz.capacity()+2))
	case 'k':
		return int64(v % uint64(2*p.Burst*w+2))
	case 'f':
		return int64(v % uint64(p.Limit+2))
	case 'L':
		if v%2 == 0 {
			return p.Limit
		}
		return int64(v % 2000)
	default: // 'w', 'W': a window
		if v%2 == 0 {
			return w
		}
		return int64(v % uint64(86_400_000_002))
	}
}

// fields returns the stored form of a fixed-size state from data: the
// bytes themselves, or as many fields as the algorithm keeps, from 8
// bytes each (0 where data is short).
func (fz *fuzzRun) fields(layout uint8, data []byte, now int64) string {
	if layout == layoutRaw {
		return string(data)
	}
	typ := fuzzFields[fz.p.Algorithm]
	b := []byte{redisstore.StateBinary}
	var dec []string
	for i := range len(typ) {
		var u uint64
		if len(data) >= 8*i+8 {
			u = binary.LittleEndian.Uint64(data[8*i:])
		}
		f := math.Float64frombits(u)
		if layout != layoutDoubles {
			f = float64(fz.near(typ[i], u, now))
		}
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
		dec = append(dec, strconv.FormatFloat(f, 'f', -1, 64))
	}
	if layout == layoutDecimal {
		return strings.Join(dec, ":")
	}
	return string(b)
}

// entries returns a log's or leases' entries from data, as decimals.
func (fz *fuzzRun) entries(layout uint8, data []byte, now int64) []string {
	if layout == layoutRaw {
		return strings.Split(string(data), ",")
	}
	var out []string
	for i := 0; i+8 <= len(data) && len(out) < 64; i += 8 {
		u := binary.LittleEndian.Uint64(data[i:])
		f := math.Float64frombits(u)
		if layout != layoutDoubles {
			f = float64(fz.near('t', u, now))
		}
		out = append(out, strconv.FormatFloat(f, 'f', -1, 64))
	}
	if layout == layoutDecimal { // for entries: near, and ascending
		slices.SortFunc(out, func(a, b string) int {
			x, _ := strconv.ParseFloat(a, 64)
			y, _ := strconv.ParseFloat(b, 64)
			return cmp.Compare(x, y)
		})
	}
	return out
}

// decide spends cost (the i-th spend of a run) and checks what came of
// it; it reports whether there was a decision.
func (fz *fuzzRun) decide(cost int64, i int) (sluice.Status, bool) {
	t, ctx := fz.t, context.Background()
	key := fz.s.Key(fz.subject, fz.p)
	before := fz.c.Dump(ctx, key).Val()
	ev := formed(spending(&sluice.Evaluation{Subject: fz.subject, Policies: []*sluice.Policy{fz.p}, Cost: cost, LeaseID: fmt.Sprint("lease", i)}), fz.general)
	err := fz.s.Evaluate(ctx, ev)
	switch {
	case errors.Is(err, sluice.CorruptState):
		if !strings.Contains(err.Error(), "SLUICE_CORRUPT "+key+": ") {
			t.Fatalf("%s: spend %d: %v, want it to name the key %s", fz, i, err, key)
		}
		if after := fz.c.Dump(ctx, key).Val(); after != before {
			t.Fatalf("%s: spend %d refused as corrupt (%v) wrote: %q, then %q", fz, i, err, before, after)
		}
		return sluice.Status{}, false
	case errors.Is(err, sluice.ClockUnsafe) && i == 0 && fz.caller:
		return sluice.Status{}, false // written further ahead than MaxClockRegression
	case err != nil:
		t.Fatalf("%s: spend %d: %v", fz, i, err)
	}
	st, span := ev.Statuses[0], time.Duration(fz.span())*time.Microsecond
	switch {
	case st.Limit != fz.capacity() || st.Remaining < 0 || st.Remaining > st.Limit:
		t.Fatalf("%s: spend %d = %+v, want limit %d, 0 <= remaining <= limit", fz, i, st, fz.capacity())
	case st.Allowed != (st.RetryAfter == 0) || st.RetryAfter < 0 || st.ResetAfter < 0:
		t.Fatalf("%s: spend %d = %+v, want a retry wait > 0 exactly when denied, waits >= 0", fz, i, st)
	case st.RetryAfter > span || st.ResetAfter > span:
		t.Fatalf("%s: spend %d = %+v, want waits of at most %v", fz, i, st, span)
	}
	return st, true
}
