package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

// TestCorruptSettleRecords: an estimate's or a settle's record that no
// estimate or settle leaves (a cost of 0 or past 10^9, a time past 2^53,
// no extra or one too long, a settled value below 0, a part that is no
// integer) makes the settle, and its retry, corrupt_state, writing
// nothing; a token bucket's tokens a debt of 10^9 tokens or more below
// empty are corrupt too.
func TestCorruptSettleRecords(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	p := policy(t, "tokens", sluice.TokenBucket, 100, time.Hour)
	p.DedupeTTL = time.Hour
	l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, forged string }{
		{"e:x", "1,100,60,0,0|0,1767225600000000"},
		{"e:x", "1,100,60,0,0|1000000001,1767225600000000"},
		{"e:x", "1,100,60,0,0|40,9007199254740993"},
		{"e:x", "1,100,60,0,0"},
		{"e:x", "1,100,60,0,0|40,1767225600000000,7"},
		{"e:x", "1,100,60,0,0|40,x"},
		{"t:x", "1,100,90,0,0|0,-1,0"},
		{"t:x", "1,100,90,0,0|0,30"},
	} {
		subj := subject(t)
		req := sluice.Request{Op: sluice.Estimate, Policy: "tokens", Subject: subj, Cost: 40, EvaluationID: "x"}
		if o := l.Check(ctx, req); o.Kind != sluice.Allowed {
			t.Fatalf("estimate = %+v, want allowed", o)
		}
		if tc.id == "t:x" {
			req.Op, req.Cost = sluice.Settle, 10
			if o := l.Check(ctx, req); o.Kind != sluice.Allowed {
				t.Fatalf("settle = %+v, want allowed", o)
			}
		}
		hkey := s.Key(subj, p)
		hkey = hkey[:strings.LastIndexByte(hkey, ':')] + ":idv"
		if err := c.HSet(ctx, hkey, tc.id, tc.forged).Err(); err != nil {
			t.Fatal(err)
		}
		before := c.Dump(ctx, s.Key(subj, p)).Val()
		req.Op, req.Cost = sluice.Settle, 10
		if o := l.Check(ctx, req); o.Kind != sluice.Unavailable || o.Cause != sluice.CorruptState {
			t.Fatalf("settle over the record %s = %q: %+v (err %v), want Unavailable, corrupt_state", tc.id, tc.forged, o, o.Err)
		}
		if after := c.Dump(ctx, s.Key(subj, p)).Val(); after != before {
			t.Fatalf("a settle refused for a corrupt record %q wrote the state", tc.forged)
		}
	}
}

// TestTokenBucketDebtBounds: a bucket's stored tokens below empty, a
// settle's debt, are decided on (denied until paid off) down to 10^9
// tokens of debt; from there they are corrupt_state, in the short form
// and the general one.
func TestTokenBucketDebtBounds(t *testing.T) {
	ctx := context.Background()
	c := standaloneClient(t)
	s := newStore(t, c, redisstore.Options{})
	p := policy(t, "tb", sluice.TokenBucket, 100, time.Second)
	l, err := sluice.New(s, []sluice.Policy{*p}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := float64(time.Now().UnixMicro())
	for _, tc := range []struct {
		tokens float64
		want   sluice.Kind
	}{{-50e6, sluice.Denied}, {-1e15 + 1e6, sluice.Denied}, {-1e15, sluice.Unavailable}} {
		subj := subject(t)
		if err := setBinary(c, tc.tokens, now, 1e6)(s.Key(subj, p)); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"", "retry-1"} {
			if o := l.Check(ctx, sluice.Request{Policy: "tb", Subject: subj, EvaluationID: id}); o.Kind != tc.want {
				t.Fatalf("spend on a bucket of %g tokens (id %q) = %+v (err %v), want %v", tc.tokens/1e6, id, o, o.Err, tc.want)
			}
		}
	}
}
