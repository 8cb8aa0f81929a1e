package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/server"
)

var leasePolicies = []sluice.Policy{
	{ID: "reports", Algorithm: sluice.Concurrency, Limit: 2, LeaseTTL: 30 * time.Second},
	{ID: "hourly", Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour},
}

// TestLeaseCheckAndRelease: an allowed check of a concurrency policy
// answers a lease_id; the third at once is 429 until one is released;
// releasing twice, or a lease never acquired, is 200; a released slot is
// free again.
func TestLeaseCheckAndRelease(t *testing.T) {
	f := newFixture(t, leasePolicies, server.Options{})
	const acquire = `{"policy":"reports","subject":"alice"}`
	_, first := f.post(t, acquire)
	_, second := f.post(t, acquire)
	if first.LeaseID == "" || second.LeaseID == "" || first.LeaseID == second.LeaseID || strings.Contains(first.LeaseID, "alice") {
		t.Fatalf("two allowed checks: lease ids %q and %q, want two distinct ones without the subject", first.LeaseID, second.LeaseID)
	}
	resp, a := f.post(t, acquire)
	if resp.StatusCode != http.StatusTooManyRequests || a.LeaseID != "" || a.RetryAfterMS != 30000 || resp.Header.Get("Retry-After") != "30" {
		t.Fatalf("third at once: %d %+v (Retry-After %q), want 429 without a lease, retry after 30s", resp.StatusCode, a, resp.Header.Get("Retry-After"))
	}
	release := fmt.Sprintf(`{"policy":"reports","subject":"alice","lease_id":%q}`, first.LeaseID)
	for i := range 2 {
		resp, a := f.postTo(t, "/v1/release", release)
		want := answer{Outcome: "allowed", Allowed: true, Limit: 2, Remaining: 1, ResetAfterMS: 30000}
		if resp.StatusCode != http.StatusOK || !cmp.Equal(a, want) {
			t.Fatalf("release #%d: %d %+v, want 200 %+v", i+1, resp.StatusCode, a, want)
		}
	}
	if resp, _ := f.postTo(t, "/v1/release", `{"policy":"reports","subject":"alice","lease_id":"never-acquired"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("release of a lease never acquired: %d, want 200", resp.StatusCode)
	}
	if resp, a := f.post(t, acquire); resp.StatusCode != http.StatusOK || a.LeaseID == "" {
		t.Fatalf("check after a release: %d %+v, want 200 with a lease", resp.StatusCode, a)
	}
	// The holder of the second lease died: its slot is back after lease_ttl.
	f.clock.Advance(30 * time.Second)
	if resp, _ := f.post(t, acquire); resp.StatusCode != http.StatusOK {
		t.Fatalf("check 30s later: %d, want 200 (expired leases count for nothing)", resp.StatusCode)
	}
	// Renew keeps a lease; release after expiry is harmless.
	f.clock.Advance(20 * time.Second)
	_, third := f.post(t, acquire)
	renew := fmt.Sprintf(`{"policy":"reports","subject":"alice","lease_id":%q}`, third.LeaseID)
	if resp, a := f.postTo(t, "/v1/renew", renew); resp.StatusCode != http.StatusOK || a.LeaseID != third.LeaseID || a.ResetAfterMS != 30000 {
		t.Fatalf("renew: %d %+v, want 200 naming the lease, reset after 30s", resp.StatusCode, a)
	}
	f.clock.Advance(time.Hour)
	if resp, a := f.postTo(t, "/v1/release", renew); resp.StatusCode != http.StatusOK || a.Remaining != 2 {
		t.Fatalf("release after expiry: %d %+v, want 200, 2 remaining", resp.StatusCode, a)
	}
}

// TestLeaseWithRate: "10 per hour and 2 at once" in one check; the lease
// id names the concurrency policy's lease, released with "policies".
func TestLeaseWithRate(t *testing.T) {
	f := newFixture(t, leasePolicies, server.Options{})
	const both = `{"policies":["hourly","reports"],"subject":"bob"}`
	_, a := f.post(t, both)
	f.post(t, both)
	resp, denied := f.post(t, both)
	if a.LeaseID == "" || resp.StatusCode != http.StatusTooManyRequests || denied.Statuses[0].Remaining != 8 {
		t.Fatalf("three checks of both: first %+v, third %d %+v; want a lease, then 429 with hourly unspent (8)", a, resp.StatusCode, denied)
	}
	resp, r := f.postTo(t, "/v1/release", fmt.Sprintf(`{"policies":["reports"],"subject":"bob","lease_id":%q}`, a.LeaseID))
	if resp.StatusCode != http.StatusOK || len(r.Statuses) != 1 || r.Remaining != 1 {
		t.Fatalf("release: %d %+v, want 200 with one status, 1 remaining", resp.StatusCode, r)
	}
	// Naming every policy of the check releases from the concurrency ones
	// and leaves the rate alone.
	resp, r = f.postTo(t, "/v1/release", fmt.Sprintf(`{"policies":["hourly","reports"],"subject":"bob","lease_id":%q}`, a.LeaseID))
	if resp.StatusCode != http.StatusOK || len(r.Statuses) != 1 || r.Statuses[0].Policy != "reports" {
		t.Fatalf("release naming the check's policies: %d %+v, want 200 with the status of reports only", resp.StatusCode, r)
	}
	if _, a := f.post(t, `{"policy":"hourly","subject":"bob","cost":0}`); a.Remaining != 8 {
		t.Fatalf("hourly after the releases: %d remaining, want 8 (nothing given back)", a.Remaining)
	}
	resp, r = f.postTo(t, "/v1/release", fmt.Sprintf(`{"policy":"hourly","subject":"bob","lease_id":%q}`, a.LeaseID))
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(r.Reason, "names no concurrency policy") {
		t.Fatalf("release naming only a rate policy: %d %+v, want 400", resp.StatusCode, r)
	}
}

// TestLeaseRequestErrors: malformed releases are 400 and name the field.
func TestLeaseRequestErrors(t *testing.T) {
	f := newFixture(t, leasePolicies, server.Options{})
	for _, c := range []struct{ path, body, reason string }{
		{"/v1/release", `{"policy":"reports","subject":"alice"}`, "lease_id is required"},
		{"/v1/release", `{"policy":"reports","subject":"alice","lease_id":"x","cost":2}`, "lease_id only"},
		{"/v1/release", `{"policy":"reports","subject":"alice","lease_id":"a b"}`, "lease id byte 1"},
		{"/v1/check", `{"policy":"reports","subject":"alice","lease_id":"x"}`, "lease_id belongs to"},
	} {
		resp, a := f.postTo(t, c.path, c.body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(a.Reason, c.reason) {
			t.Errorf("POST %s %s: %d %q, want 400 with %q", c.path, c.body, resp.StatusCode, a.Reason, c.reason)
		}
	}
	if resp, _ := f.postTo(t, "/v1/release", `{"policy":"nope","subject":"alice","lease_id":"x"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("release of an unknown policy: %d, want 404", resp.StatusCode)
	}
}

// TestLeaseScopes: release needs the check scope, as the check that
// acquired the lease did; a refund-only token is refused.
func TestLeaseScopes(t *testing.T) {
	refundOnly := server.Token{ID: "refunder", Secret: []byte("refund-only-secret-0123456789abcdef"), Scopes: []string{config.ScopeRefund}}
	f := newFixture(t, leasePolicies, server.Options{Tokens: []server.Token{appToken, refundOnly}})
	const body = `{"policy":"reports","subject":"alice","lease_id":"x"}`
	if code, reason, _ := sendTo(t, f.url+"/v1/release", "", body); code != http.StatusUnauthorized {
		t.Errorf("release without a token: %d %q, want 401", code, reason)
	}
	if code, reason, auth := sendTo(t, f.url+"/v1/release", "Bearer "+string(refundOnly.Secret), body); code != http.StatusForbidden || !strings.Contains(auth, `scope="check"`) {
		t.Errorf("release with a refund-only token: %d %q %q, want 403 naming scope check", code, reason, auth)
	}
	if code, reason, _ := sendTo(t, f.url+"/v1/release", "Bearer "+string(appToken.Secret), body); code != http.StatusOK {
		t.Errorf("release with a check token: %d %q, want 200", code, reason)
	}
}
