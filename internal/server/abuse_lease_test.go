package server_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/checkapi"
)

// lease sends op (checkapi.CheckPath acquires, ReleasePath, RenewPath)
// on policy for subj with the lease id (none for an acquire) and
// returns the status and the answer.
func (h *hostile) lease(t *testing.T, path, policy, subj, id string) (int, checkapi.Answer) {
	t.Helper()
	if path == checkapi.CheckPath {
		return h.post(t, path, abuseCheck, fmt.Sprintf(`{"policy":%q,"subject":%q,"cost":1000000}`, policy, subj))
	}
	return h.post(t, path, abuseCheck, fmt.Sprintf(`{"policy":%q,"subject":%q,"lease_id":%q}`, policy, subj, id))
}

// held acquires n leases of policy for subj, each answered 200 with a
// lease id of its own, and returns them.
func (h *hostile) held(t *testing.T, policy, subj string, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		code, a := h.lease(t, checkapi.CheckPath, policy, subj, "")
		if code != 200 || a.LeaseID == "" {
			t.Fatalf("acquire of %s = %d %+v, want 200 with a lease", policy, code, a)
		}
		ids = append(ids, a.LeaseID)
	}
	return ids
}

// TestAbuseLease plays a client of the check scope on concurrency
// policies: acquires past the limit at any cost, a lease id of its own
// choosing, releases and renewals of leases it never acquired or that
// expired. The bound: at most limit leases live at once, each for at
// most lease_ttl after its acquisition or last renewal; a release frees
// only the lease it names, for the subject it names.
func TestAbuseLease(t *testing.T) {
	onBothStores(t, func(t *testing.T, h *hostile) {
		for _, r := range leaseAbuses {
			subj := t.Name() + "/" + r.name
			code, want, left := r.play(t, h, subj)
			if code != want {
				t.Errorf("%s: answered %d, want %d", r.name, code, want)
			}
			if left >= 0 {
				if got := h.left(t, "conc", subj); got != left {
					t.Errorf("%s: %d leases of conc left, want %d", r.name, got, left)
				}
			}
		}
	})
}

// leaseAbuses are TestAbuseLease's rows: each plays its caller for subj
// and returns the last answer's status, the one it wants, and the leases
// of conc it wants left for subj (-1: not asked).
var leaseAbuses = []struct {
	name string
	play func(t *testing.T, h *hostile, subj string) (code int, want int, left int64)
}{
	{"acquires past the limit at any cost", func(t *testing.T, h *hostile, subj string) (int, int, int64) {
		h.held(t, "conc", subj, 2)
		code, _ := h.lease(t, checkapi.CheckPath, "conc", subj, "")
		return code, 429, 0
	}},
	{"an acquire naming its own lease", func(t *testing.T, h *hostile, subj string) (int, int, int64) {
		code, _ := h.post(t, checkapi.CheckPath, abuseCheck, fmt.Sprintf(`{"policy":"conc","subject":%q,"lease_id":"mine"}`, subj))
		return code, 400, 2
	}},
	{"releases of leases never acquired", func(t *testing.T, h *hostile, subj string) (int, int, int64) {
		h.held(t, "conc", subj, 2)
		for _, id := range []string{"never-acquired", "AAAAAAAAAAAAAAAAAAAAAA", "x"} {
			if code, a := h.lease(t, checkapi.ReleasePath, "conc", subj, id); code != 200 || a.Remaining != 0 {
				t.Errorf("release of %q, never acquired = %d %+v, want 200 with 0 left", id, code, a)
			}
		}
		code, _ := h.lease(t, checkapi.CheckPath, "conc", subj, "")
		return code, 429, 0
	}},
	{"a release naming another subject", func(t *testing.T, h *hostile, subj string) (int, int, int64) {
		for _, id := range h.held(t, "conc", subj, 2) {
			if code, _ := h.lease(t, checkapi.ReleasePath, "conc", subj+", another", id); code != 200 {
				t.Errorf("release under another subject = %d, want 200 (harmless)", code)
			}
		}
		code, _ := h.lease(t, checkapi.CheckPath, "conc", subj, "")
		return code, 429, 0
	}},
	{"a release twice", func(t *testing.T, h *hostile, subj string) (int, int, int64) {
		ids := h.held(t, "conc", subj, 2)
		h.lease(t, checkapi.ReleasePath, "conc", subj, ids[0])
		code, _ := h.lease(t, checkapi.ReleasePath, "conc", subj, ids[0])
		return code, 200, 1
	}},
	{"a release of a rate policy", func(t *testing.T, h *hostile, subj string) (int, int, int64) {
		code, _ := h.lease(t, checkapi.ReleasePath, "fw", subj, "abc")
		return code, 400, 2
	}},
	{"renewals of leases never acquired, all held", func(t *testing.T, h *hostile, subj string) (int, int, int64) {
		h.held(t, "conc", subj, 2)
		for _, id := range []string{"never-acquired", "AAAAAAAAAAAAAAAAAAAAAA"} {
			if code, a := h.lease(t, checkapi.RenewPath, "conc", subj, id); code != 429 {
				t.Errorf("renewal of %q, never acquired, with every slot held = %d %+v, want 429", id, code, a)
			}
		}
		code, _ := h.lease(t, checkapi.CheckPath, "conc", subj, "")
		return code, 429, 0
	}},
	{"renewals add no time past lease_ttl", func(t *testing.T, h *hostile, subj string) (int, int, int64) {
		id := h.held(t, "conc", subj, 1)[0]
		var code int
		for range 5 {
			var a checkapi.Answer
			if code, a = h.lease(t, checkapi.RenewPath, "conc", subj, id); a.ResetAfterMS > time.Hour.Milliseconds() || a.LeaseID != id {
				t.Errorf("renewal = %d %+v: want the lease %s held at most lease_ttl (3600000 ms) from now", code, a, id)
			}
		}
		return code, 200, 1
	}},
	{"a renewal after lease_ttl, its slot taken", func(t *testing.T, h *hostile, subj string) (int, int, int64) {
		id := h.held(t, "short", subj, 1)[0]
		h.outlive(t, 2*time.Second, func() bool { return h.left(t, "short", subj) == 1 })
		h.held(t, "short", subj, 1) // another holder, for 2s from now
		code, _ := h.lease(t, checkapi.RenewPath, "short", subj, id)
		return code, 429, -1
	}},
}
