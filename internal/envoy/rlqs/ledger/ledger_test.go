package ledger

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestClaim(t *testing.T) {
	ctx, ttl := context.Background(), 10*time.Second
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	m := NewMemory(clk.now)
	steps := []struct {
		name     string
		instance string
		c        Claim
		advance  time.Duration
		want     Grant
	}{
		{"a wishes for less than the policy: granted all",
			"a", Claim{Bucket: "b", Rate: 1000, Burst: 2000, Demand: 5, Streams: 1, Wish: 600, WishBurst: 1200}, 0,
			Grant{Rate: 600, Burst: 1200, Reserved: 600, ReservedBurst: 1200, Demand: 5, Streams: 1}},
		{"b wishes for more than is left: granted the rest",
			"b", Claim{Bucket: "b", Rate: 1000, Burst: 2000, Demand: 7, Streams: 2, Wish: 900, WishBurst: 1800}, 0,
			Grant{Rate: 400, Burst: 800, Reserved: 400, ReservedBurst: 800, Demand: 12, Streams: 3}},
		{"a wishes for less but still has more in force: reserved stays",
			"a", Claim{Bucket: "b", Rate: 1000, Burst: 2000, Demand: 1, Streams: 1, Wish: 100, WishBurst: 200, Committed: 600, CommittedBurst: 1200}, 0,
			Grant{Rate: 100, Burst: 200, Reserved: 600, ReservedBurst: 1200, Demand: 8, Streams: 3}},
		{"a's streams now hold only the smaller share: b may grow",
			"a", Claim{Bucket: "b", Rate: 1000, Burst: 2000, Demand: 1, Streams: 1, Wish: 100, WishBurst: 200, Committed: 100, CommittedBurst: 200}, 0,
			Grant{Rate: 100, Burst: 200, Reserved: 100, ReservedBurst: 200, Demand: 8, Streams: 3}},
		{"b grows into what a freed",
			"b", Claim{Bucket: "b", Rate: 1000, Burst: 2000, Demand: 7, Streams: 2, Wish: 900, WishBurst: 1800, Committed: 400, CommittedBurst: 800}, 0,
			Grant{Rate: 900, Burst: 1800, Reserved: 900, ReservedBurst: 1800, Demand: 8, Streams: 3}},
		{"a's entry expires: b alone",
			"b", Claim{Bucket: "b", Rate: 1000, Burst: 2000, Demand: 7, Streams: 2, Wish: 1000, WishBurst: 2000, Committed: 900, CommittedBurst: 1800}, 11 * time.Second,
			Grant{Rate: 1000, Burst: 2000, Reserved: 1000, ReservedBurst: 2000, Demand: 7, Streams: 2}},
		{"b leaves the bucket",
			"b", Claim{Bucket: "b", Rate: 1000, Burst: 2000}, 0,
			Grant{}},
		{"a plan lowered the rate below what is in force: reserved keeps what is in force",
			"a", Claim{Bucket: "b", Rate: 50, Burst: 100, Demand: 1, Streams: 1, Wish: 50, WishBurst: 100, Committed: 100, CommittedBurst: 200}, 0,
			Grant{Rate: 50, Burst: 100, Reserved: 100, ReservedBurst: 200, Demand: 1, Streams: 1}},
	}
	for _, s := range steps {
		clk.t = clk.t.Add(s.advance)
		gs, err := m.Claim(ctx, "d", s.instance, []Claim{s.c}, ttl)
		if err != nil {
			t.Fatalf("%s: Claim: %v", s.name, err)
		}
		if diff := cmp.Diff(s.want, gs[0]); diff != "" {
			t.Fatalf("%s: Claim(%q, %+v) (-want +got):\n%s", s.name, s.instance, s.c, diff)
		}
	}
	if err := m.Release(ctx, "d", "a"); err != nil {
		t.Fatal(err)
	}
	if n := len(m.domains["d"].buckets); n != 0 {
		t.Fatalf("after Release of the last instance, %d buckets kept, want 0", n)
	}
}

// TestReservationsNeverExceedThePolicy plays random claims of several
// instances, each honest about what it committed (never more than its
// last reservation, as the service guarantees), and checks the invariant
// the bound rests on: Σ reserved ≤ Rate and ≤ Burst after every claim.
func TestReservationsNeverExceedThePolicy(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	m := NewMemory(clk.now)
	const rate, burst = 10_000, 20_000
	reserved := map[string][2]int64{}
	instances := []string{"a", "b", "c", "d"}
	for i := range 5000 {
		in := instances[rng.IntN(len(instances))]
		r := reserved[in]
		c := Claim{Bucket: "x", Rate: rate, Burst: burst, Demand: rng.Int64N(100), Streams: rng.Int64N(4),
			Wish: rng.Int64N(rate + 1), WishBurst: rng.Int64N(burst + 1)}
		if r[0] > 0 {
			c.Committed = rng.Int64N(r[0] + 1)
		}
		if r[1] > 0 {
			c.CommittedBurst = rng.Int64N(r[1] + 1)
		}
		gs, err := m.Claim(context.Background(), "d", in, []Claim{c}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		g := gs[0]
		if g.Rate > c.Wish || g.Burst > c.WishBurst || g.Rate < 0 || g.Burst < 0 {
			t.Fatalf("seed %d step %d: Claim(%+v) = %+v: granted more than wished, or below 0", seed, i, c, g)
		}
		reserved[in] = [2]int64{g.Reserved, g.ReservedBurst}
		var sr, sb int64
		for _, r := range reserved {
			sr, sb = sr+r[0], sb+r[1]
		}
		if sr > rate || sb > burst {
			t.Fatalf("seed %d step %d: reservations sum to %d/%d, above the policy's %d/%d", seed, i, sr, sb, rate, burst)
		}
	}
}
