package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// The standalone server every test here shares, started on first use.
var shared struct {
	once sync.Once
	srv  *redistest.Server
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.Stop()
	}
	os.Exit(code)
}

// standalone returns a client of the shared server; tests keep apart by
// their own domains.
func standalone(t testing.TB) *redis.Client {
	t.Helper()
	shared.once.Do(func() { shared.srv, shared.err = redistest.StartServer("") })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	c := shared.srv.Client()
	t.Cleanup(func() { c.Close() })
	return c
}

// storedEntries decodes the entries Redis holds for bucket (claim.lua's
// put: their number, 2 bytes little-endian, then each entry's instance,
// zero-terminated, and five little-endian doubles).
func storedEntries(t *testing.T, c redis.UniversalClient, domain, bucket string) []entry {
	t.Helper()
	v, err := c.HGet(context.Background(), key(defaultPrefix, domain), bucket).Result()
	if err == redis.Nil {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	b := []byte(v)
	if len(b) < 2 {
		t.Fatalf("bucket %q: %d bytes, want a count of 2", bucket, len(b))
	}
	k := int(binary.LittleEndian.Uint16(b))
	b = b[2:]
	var es []entry
	for range k {
		n := bytes.IndexByte(b, 0)
		if n < 1 || len(b) < n+1+40 {
			t.Fatalf("bucket %q: an entry of %d bytes left: want an instance, a NUL and 40 bytes", bucket, len(b))
		}
		f := func(i int) int64 { return int64(math.Float64frombits(binary.LittleEndian.Uint64(b[n+1+8*i:]))) }
		es = append(es, entry{instance: string(b[:n]), expires: f(0), reserved: f(1), reservedBurst: f(2), demand: f(3), streams: f(4)})
		b = b[n+1+40:]
	}
	if len(b) > 0 {
		t.Fatalf("bucket %q: %d bytes after its %d entries", bucket, len(b), k)
	}
	return es
}

// waitRedisPast waits until Redis's clock reads later than t (µs): the
// event an expiry waits for.
func waitRedisPast(t *testing.T, c redis.UniversalClient, at int64) {
	t.Helper()
	for {
		now, err := c.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.UnixMicro() > at {
			return
		}
	}
}

// TestRedisMatchesMemory plays random claims of several instances on
// several buckets, a bucket now and then twice in one call, with entries
// of short and long TTLs and Redis's clock now and then run past the
// short ones, against Redis and against Memory driven at the time the
// script read: identical grants, and identical live entries at the end.
func TestRedisMatchesMemory(t *testing.T) {
	ctx, c := context.Background(), standalone(t)
	r := newRedis(t, c)
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 1))
	var clk time.Time
	m := NewMemory(func() time.Time { return clk })
	domain := fmt.Sprintf("diff-%d", seed)
	instances, buckets := []string{"a", "bb", "instance-c"}, []string{"x", "y", "z", "w"}
	ttls := []time.Duration{time.Millisecond, 3 * time.Millisecond, time.Minute}
	var latest, expired int64
	for step := range 1500 {
		in := instances[rng.IntN(len(instances))]
		cs := make([]Claim, 1+rng.IntN(3))
		for i := range cs {
			cs[i] = randomClaim(rng, buckets[rng.IntN(len(buckets))])
		}
		ttl := ttls[rng.IntN(len(ttls))]
		gs, now, err := r.claim(ctx, domain, in, cs, ttl)
		if err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
		clk = time.UnixMicro(now)
		expired += countExpired(m, domain, cs, now)
		want, err := m.Claim(ctx, domain, in, cs, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, gs); diff != "" {
			t.Fatalf("seed %d step %d: Claim(%q, %+v) at %d (-memory +redis):\n%s", seed, step, in, cs, now, diff)
		}
		if ttl < time.Minute {
			latest = max(latest, now+ttl.Microseconds())
		}
		if rng.IntN(40) == 0 {
			waitRedisPast(t, c, latest)
		}
	}
	if expired < 20 {
		t.Errorf("seed %d: only %d claims met an expired entry: the test did not exercise expiry", seed, expired)
	}
	for _, b := range buckets {
		var got, want []entry
		for _, e := range storedEntries(t, c, domain, b) {
			if e.expires > clk.UnixMicro() {
				got = append(got, e)
			}
		}
		for _, e := range m.domains[domain].buckets[b] {
			if e.expires > clk.UnixMicro() {
				want = append(want, e)
			}
		}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(entry{})); diff != "" {
			t.Errorf("seed %d: bucket %s's live entries (-memory +redis):\n%s", seed, b, diff)
		}
	}
}

// randomClaim returns a claim on bucket of a policy drawn from two, so
// that a plan's change is played too.
func randomClaim(rng *rand.Rand, bucket string) Claim {
	rate, burst := int64(10_000), int64(20_000)
	if rng.IntN(5) == 0 {
		rate, burst = 3_000, 5_000
	}
	c := Claim{Bucket: bucket, Rate: rate, Burst: burst, Demand: rng.Int64N(1000), Streams: rng.Int64N(4),
		Wish: rng.Int64N(rate + 1), WishBurst: rng.Int64N(burst + 1)}
	if rng.IntN(2) == 0 {
		c.Committed, c.CommittedBurst = rng.Int64N(rate/2+1), rng.Int64N(burst/2+1)
	}
	return c
}

// countExpired counts the entries cs's buckets hold in m that have
// expired at now.
func countExpired(m *Memory, domain string, cs []Claim, now int64) int64 {
	d := m.domains[domain]
	if d == nil {
		return 0
	}
	var n int64
	for _, c := range cs {
		for _, e := range d.buckets[c.Bucket] {
			if e.expires <= now {
				n++
			}
		}
	}
	return n
}

// TestRedisReservationsNeverExceedThePolicy: instances claiming one
// bucket at once from goroutines, each honest about what it committed,
// while an observer reads the bucket's entries: every state it reads
// reserves at most the policy. A claim that read and wrote in two steps
// would let two instances take the same free capacity.
func TestRedisReservationsNeverExceedThePolicy(t *testing.T) {
	ctx, c := context.Background(), standalone(t)
	r := newRedis(t, c)
	const rate, burst = 10_000, 20_000
	domain := fmt.Sprintf("concurrent-%d", rand.Uint64())
	var claimers sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, 8)
	for i := range 6 {
		claimers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			var last Grant
			for range 300 {
				c := Claim{Bucket: "x", Rate: rate, Burst: burst, Demand: rng.Int64N(100), Streams: 1,
					Wish: rng.Int64N(rate + 1), WishBurst: rng.Int64N(burst + 1),
					Committed: rng.Int64N(last.Reserved + 1), CommittedBurst: rng.Int64N(last.ReservedBurst + 1)}
				gs, err := r.Claim(ctx, domain, fmt.Sprint("instance-", i), []Claim{c}, time.Minute)
				if err != nil {
					errs <- err
					return
				}
				if last = gs[0]; last.Rate > c.Wish || last.Burst > c.WishBurst {
					errs <- fmt.Errorf("Claim(%+v) = %+v: granted more than wished", c, last)
					return
				}
			}
		})
	}
	go func() { claimers.Wait(); close(done) }()
	reads := 0
	for observing := true; observing; reads++ {
		select {
		case <-done:
			observing = false
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		var sr, sb int64
		for _, e := range storedEntries(t, c, domain, "x") {
			sr, sb = sr+e.reserved, sb+e.reservedBurst
		}
		if sr > rate || sb > burst {
			t.Fatalf("read %d: reservations sum to %d/%d, above the policy's %d/%d", reads, sr, sb, rate, burst)
		}
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	t.Logf("%d reads of the bucket while 6 instances claimed", reads)
}

// rlqsACL is exactly what the ledger needs of a Redis user: its code
// loaded and called either way, and the commands the code calls, on its
// keys only (docs/rlqs.md quotes it).
const rlqsACL = "resetkeys resetchannels -@all ~sluice:rlqs:* +fcall +function|load +evalsha +script|load " +
	"+time +hget +hmget +hset +hdel +hgetall +pttl +pexpire"

// TestRedisACL: the ledger works for a user allowed exactly rlqsACL and
// for the Redis store's user (redistest.ACLUser); for a user who may not
// run functions, it falls back to EVALSHA, for good, and reloads the
// script after a SCRIPT FLUSH.
func TestRedisACL(t *testing.T) {
	ctx := context.Background()
	a := redistest.ACL(t, "sluice:")
	admin := a.AdminClient()
	defer admin.Close()
	setuser := []any{"acl", "setuser", "rlqs", "on", ">rlqs-pw"}
	for _, f := range strings.Fields(rlqsACL) {
		setuser = append(setuser, f)
	}
	if err := admin.Do(ctx, setuser...).Err(); err != nil {
		t.Fatal(err)
	}
	users := map[string]*redis.Client{
		"exact":      redis.NewClient(&redis.Options{Addr: a.Addr, Username: "rlqs", Password: "rlqs-pw"}),
		"redisstore": a.UserClient(),
	}
	for name, c := range users {
		defer c.Close()
		r := newRedis(t, c)
		playTwoInstances(t, r, "acl-"+name)
		if r.scripts.Load() {
			t.Errorf("%s: the ledger fell back to scripts for a user allowed functions", name)
		}
	}
	if err := admin.Do(ctx, "acl", "setuser", "rlqs", "-fcall", "-function|load").Err(); err != nil {
		t.Fatal(err)
	}
	r := newRedis(t, users["exact"])
	playTwoInstances(t, r, "acl-scripts")
	if !r.scripts.Load() {
		t.Fatal("the ledger did not fall back to scripts for a user refused FCALL")
	}
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	playTwoInstances(t, r, "acl-flushed")
}

// playTwoInstances plays two instances sharing a bucket on r and checks
// the ledger's answers, then that Release frees the first one's share.
func playTwoInstances(t *testing.T, r *Redis, domain string) {
	t.Helper()
	ctx := context.Background()
	c := Claim{Bucket: "b", Rate: 1000, Burst: 2000, Demand: 5, Streams: 1, Wish: 600, WishBurst: 1200}
	steps := []struct {
		instance string
		want     Grant
	}{
		{"one", Grant{Rate: 600, Burst: 1200, Reserved: 600, ReservedBurst: 1200, Demand: 5, Streams: 1}},
		{"two", Grant{Rate: 400, Burst: 800, Reserved: 400, ReservedBurst: 800, Demand: 10, Streams: 2}},
	}
	for _, s := range steps {
		gs, err := r.Claim(ctx, domain, s.instance, []Claim{c}, time.Minute)
		if err != nil {
			t.Fatalf("%s: Claim(%q): %v", domain, s.instance, err)
		}
		if diff := cmp.Diff(s.want, gs[0]); diff != "" {
			t.Fatalf("%s: Claim(%q) (-want +got):\n%s", domain, s.instance, diff)
		}
	}
	if err := r.Release(ctx, domain, "one"); err != nil {
		t.Fatalf("%s: Release: %v", domain, err)
	}
	gs, err := r.Claim(ctx, domain, "two", []Claim{c}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Grant{Rate: 600, Burst: 1200, Reserved: 600, ReservedBurst: 1200, Demand: 5, Streams: 1}); gs[0] != want {
		t.Fatalf("%s: after one's Release, Claim(two) = %+v, want %+v", domain, gs[0], want)
	}
}

// TestRedisCluster: on a 3-master Cluster, domains that live on every
// master each get their library loaded where they live, and the ledger
// answers as on one Redis, after a FUNCTION FLUSH too.
func TestRedisCluster(t *testing.T) {
	ctx := context.Background()
	cl := redistest.Cluster(t)
	c := cl.Client()
	defer c.Close()
	r := newRedis(t, c)
	masters := map[string][]string{}
	for i := 0; len(masters) < 3 && i < 100; i++ {
		d := fmt.Sprint("cluster-", i)
		m, err := c.MasterForKey(ctx, key(defaultPrefix, d))
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = append(masters[m.Options().Addr], d)
	}
	if len(masters) < 3 {
		t.Fatalf("domains reach %d masters, want 3", len(masters))
	}
	for _, ds := range masters {
		playTwoInstances(t, r, ds[0])
	}
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.FunctionFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	for _, ds := range masters {
		playTwoInstances(t, r, ds[0]+"-flushed")
	}
	if r.scripts.Load() {
		t.Error("the ledger fell back to scripts on a Cluster of Redis 7")
	}
}

// TestRedisCorruptField: a field the code did not write fails the claim
// with an error naming no bucket, and the claim writes nothing, not even
// to the other buckets it named.
func TestRedisCorruptField(t *testing.T) {
	ctx, c := context.Background(), standalone(t)
	r := newRedis(t, c)
	entry := func(inst string) string { return inst + "\x00" + strings.Repeat("\x00", 40) }
	bad := map[string]string{
		"garbage":           "\x05ab",
		"empty":             "",
		"no entries":        "\x00\x00",
		"short":             "\x01\x00" + entry("a")[:30],
		"an empty instance": "\x02\x00" + entry("abc") + entry(""),
		"bytes after":       "\x01\x00" + entry("a") + "x",
		"count above":       "\x02\x00" + entry("a"),
	}
	for name, v := range bad {
		domain := fmt.Sprintf("corrupt-%d", rand.Uint64())
		if err := c.HSet(ctx, key(defaultPrefix, domain), "bad", v).Err(); err != nil {
			t.Fatal(err)
		}
		cs := []Claim{{Bucket: "good", Rate: 10, Burst: 10, Streams: 1, Wish: 5, WishBurst: 5}, {Bucket: "bad", Rate: 10, Burst: 10, Streams: 1}}
		_, err := r.Claim(ctx, domain, "a", cs, time.Minute)
		if err == nil || !strings.HasPrefix(err.Error(), "rlqs ledger: claim: ") || !strings.Contains(err.Error(), "SLUICE_CORRUPT") {
			t.Fatalf("%s: Claim over a corrupt field = %v, want an rlqs ledger error naming SLUICE_CORRUPT", name, err)
		}
		if n, err := c.HExists(ctx, key(defaultPrefix, domain), "good").Result(); err != nil || n {
			t.Fatalf("%s: after the failed claim, HEXISTS good = %v, %v: want false", name, n, err)
		}
		if err := r.Release(ctx, domain, "a"); err == nil || !strings.Contains(err.Error(), "SLUICE_CORRUPT") {
			t.Fatalf("%s: Release over a corrupt field = %v, want SLUICE_CORRUPT", name, err)
		}
	}
}

// TestClaimArgs: what the code could not compute exactly, or would mix
// with its own field, is refused before anything is sent.
func TestClaimArgs(t *testing.T) {
	ok := Claim{Bucket: "b", Rate: 1, Burst: 1}
	cases := []struct {
		name     string
		instance string
		cs       []Claim
		ttl      time.Duration
		want     string
	}{
		{"empty instance", "", []Claim{ok}, time.Second, "instance of 0 bytes: must be 1 to 255 bytes"},
		{"long instance", strings.Repeat("i", 256), []Claim{ok}, time.Second, "instance of 256 bytes: must be 1 to 255 bytes"},
		{"NUL in instance", "a\x00b", []Claim{ok}, time.Second, "instance: holds a NUL byte: claim.lua stores it zero-terminated"},
		{"too many claims", "a", make([]Claim, MaxClaims+1), time.Second, "1001 claims: at most 1000 a call"},
		{"short ttl", "a", []Claim{ok}, time.Microsecond, "ttl 1µs: must be between 1ms and 24h0m0s"},
		{"empty bucket", "a", []Claim{ok, {Rate: 1}}, time.Second, "claims[1].Bucket: empty: a bucket's subject is never empty"},
		{"negative", "a", []Claim{{Bucket: "b", Demand: -1}}, time.Second, "claims[0].Demand = -1: must be between 0 and 2^53-1"},
		{"too large", "a", []Claim{{Bucket: "b", CommittedBurst: 1 << 53}}, time.Second, "claims[0].CommittedBurst = 9007199254740992: must be between 0 and 2^53-1"},
	}
	for _, c := range cases {
		if _, err := claimArgs(c.instance, c.cs, c.ttl); err == nil || err.Error() != c.want {
			t.Errorf("%s: claimArgs = %v, want %q", c.name, err, c.want)
		}
	}
}

// TestParseGrants: a reply of another shape is an error, never a panic.
func TestParseGrants(t *testing.T) {
	bad := []any{nil, "OK", int64(3), []any{int64(1)}, []any{int64(1), int64(1), int64(2), int64(3), int64(4), int64(5), "6"},
		[]any{int64(1), int64(1), int64(2), int64(3), int64(4), int64(5), int64(6), int64(7)}}
	for _, v := range bad {
		if _, _, err := parseGrants(v, 1); err == nil {
			t.Errorf("parseGrants(%#v, 1) = nil error, want one", v)
		}
	}
	gs, now, err := parseGrants([]any{int64(9), int64(1), int64(2), int64(3), int64(4), int64(5), int64(6)}, 1)
	if want := (Grant{1, 2, 3, 4, 5, 6}); err != nil || now != 9 || !slices.Equal(gs, []Grant{want}) {
		t.Errorf("parseGrants = %+v, %d, %v; want [%+v], 9, nil", gs, now, err, want)
	}
}

// benchRedisEnv, when set to host:port, points BenchmarkRedisClaim at
// that server instead of one it starts: a server under callgrind
// (../shared/tools/rediscg), to count its instructions per claim.
const benchRedisEnv = "SLUICE_LEDGER_BENCH_REDIS"

// BenchmarkRedisClaim: one instance's round on a domain of 100 buckets
// shared with a second instance: one call, 100 claims.
func BenchmarkRedisClaim(b *testing.B) {
	ctx := context.Background()
	var c *redis.Client
	if addr := os.Getenv(benchRedisEnv); addr != "" {
		c = redis.NewClient(&redis.Options{Addr: addr})
		b.Cleanup(func() { c.Close() })
	} else {
		c = standalone(b)
	}
	r := newRedis(b, c)
	cs := make([]Claim, 100)
	for i := range cs {
		cs[i] = Claim{Bucket: fmt.Sprintf("bucket-%03d", i), Rate: 10_000, Burst: 20_000, Demand: 50, Streams: 3,
			Wish: 4_000, WishBurst: 8_000, Committed: 4_000, CommittedBurst: 8_000}
	}
	domain := fmt.Sprintf("bench-%d", rand.Uint64())
	if _, err := r.Claim(ctx, domain, "other", cs, time.Minute); err != nil {
		b.Fatal(err)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Claim(ctx, domain, "me", cs, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := r.Claim(ctx, domain, "me", cs, time.Minute); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// newRedis is NewRedis with the default prefix, failing tb on an error.
func newRedis(tb testing.TB, c redis.UniversalClient) *Redis {
	tb.Helper()
	r, err := NewRedis(c, "")
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// TestRedisPrefix: the ledger's keys start with the prefix it is given
// (the Redis store's, so one ACL key pattern covers both), by default
// "sluice:"; a prefix with a brace or of more than 64 bytes is refused.
func TestRedisPrefix(t *testing.T) {
	ctx, c := context.Background(), standalone(t)
	domain := fmt.Sprintf("prefix-%d", rand.Uint64())
	for _, prefix := range []string{"", "tenant-7:"} {
		r, err := NewRedis(c, prefix)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Claim(ctx, domain, "a", []Claim{{Bucket: "b", Rate: 10, Burst: 10, Streams: 1, Wish: 5, WishBurst: 5}}, time.Minute); err != nil {
			t.Fatal(err)
		}
		want := prefix
		if want == "" {
			want = "sluice:"
		}
		if k := key(want, domain); !strings.HasPrefix(k, want+"rlqs:{") {
			t.Fatalf("prefix %q: key %q", prefix, k)
		} else if n, err := c.Exists(ctx, k).Result(); err != nil || n != 1 {
			t.Fatalf("prefix %q: EXISTS %s = %d (%v), want 1", prefix, k, n, err)
		}
	}
	for _, bad := range []string{"a{b:", "a}:", strings.Repeat("p", 65)} {
		if _, err := NewRedis(c, bad); err == nil || !strings.Contains(err.Error(), "must be at most 64 bytes without '{' or '}'") {
			t.Errorf("NewRedis(prefix %q) = %v, want the prefix refused", bad, err)
		}
	}
}
