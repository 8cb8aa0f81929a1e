package server

import (
	"cmp"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoy/rlqs"
)

// Envoy's quota service (envoy.rlqs) as the admin API sees it: plans
// naming a bucket (an override's rlqs), and GET /v1/rlqs, the buckets this
// server holds. A bucket id's values name tenants: no answer or log line
// here shows one, only the bucket's subject (its pseudonym).

// rlqsTarget resolves an override naming a bucket of the quota service:
// the first matcher of the domain taking the bucket id gives the policy,
// of the config's Limiter, whose plans the service reads each round; the
// subject is the bucket's as the service names it. The service reads
// plans under the current key only, so there are no older pseudonyms to
// drop.
func (s *Server) rlqsTarget(in checkapi.OverrideRequest) (overrideTarget, int, string) {
	b := in.RLQS
	switch {
	case in.Forms() > 1:
		return overrideTarget{}, http.StatusBadRequest, "set one of subject, envoy, proxy and rlqs"
	case len(b.Domain) == 0 || len(b.Domain) > checkapi.MaxSubjectLen:
		return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("rlqs.domain is %d bytes: must be 1 to %d", len(b.Domain), checkapi.MaxSubjectLen)
	case len(b.Bucket) == 0 || len(b.Bucket) > rlqs.MaxIDEntries:
		return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("rlqs.bucket has %d entries: must have 1 to %d", len(b.Bucket), rlqs.MaxIDEntries)
	}
	for k, v := range b.Bucket {
		switch {
		case k == "" || len(k) > rlqs.MaxIDBytes || len(v) > rlqs.MaxIDBytes:
			return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("rlqs.bucket: an entry of %d and %d bytes: keys must have 1 to %d, values at most %d", len(k), len(v), rlqs.MaxIDBytes, rlqs.MaxIDBytes)
		case v == "" || v == "*":
			// Neither key nor value named: the caller's words, in the log.
			return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("rlqs.bucket: a value is %q: each must be the value the bucket id has (a plan is for one bucket: never empty, never \"*\")", v)
		}
	}
	if s.rlqs == nil {
		return overrideTarget{}, http.StatusNotFound, "rlqs: this server has no Envoy quota service (envoy.rlqs)"
	}
	policy, ok := s.rlqsPolicy(b.Domain, b.Bucket)
	switch {
	case !ok:
		return overrideTarget{}, http.StatusNotFound, "rlqs: no matcher of that domain of envoy.rlqs takes the bucket id, so the plan would never apply"
	case in.Policy != "" && in.Policy != policy:
		return overrideTarget{}, http.StatusBadRequest, fmt.Sprintf("policy %q: the bucket's matcher has policy %q; leave policy out or name that one", in.Policy, policy)
	}
	return overrideTarget{lim: s.lim, policy: policy, subject: rlqs.Subject(s.pseud, b.Domain, b.Bucket), rlqs: true}, 0, ""
}

// rlqsPolicy returns the policy ID of the first matcher of domain that
// takes the bucket id id (config.MatchesBucket, the service's rule).
func (s *Server) rlqsPolicy(domain string, id map[string]string) (string, bool) {
	for _, d := range s.rlqs.Domains {
		if d.Name != domain {
			continue
		}
		for _, m := range d.Matchers {
			if config.MatchesBucket(m.Match, id) {
				return m.Policy.ID, true
			}
		}
	}
	return "", false
}

// rlqsBurstShort returns why a plan of limit, burst (0: the limit) and
// window (0: the policy's) cannot be enforced by Envoy's token bucket,
// as validate says it of a config file's plan; "" when it can.
func (s *Server) rlqsBurstShort(policy string, limit, burst int64, window time.Duration) string {
	p, ok := s.lim.Policy(policy)
	if !ok {
		return "" // setOverride answers the unknown policy
	}
	window = cmp.Or(window, p.Window)
	burst = cmp.Or(burst, limit)
	need, rate, short := config.ShortBurst(limit, burst, window)
	if !short {
		return ""
	}
	return fmt.Sprintf("burst = %d: is below the %s tokens per second the plan refills (%d per %s): %s; set burst to at least %d", burst, rate, limit, window, config.BurstRule, need)
}

// listRLQS answers GET /v1/rlqs: at most ?limit= buckets (1 to
// checkapi.RLQSMaxLimit, default checkapi.RLQSDefaultLimit) of this
// server's quota service, by domain then subject.
func (s *Server) listRLQS(w http.ResponseWriter, r *http.Request) {
	limit := checkapi.RLQSDefaultLimit
	if q := r.URL.Query().Get("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > checkapi.RLQSMaxLimit {
			s.rlqsAnswer(w, http.StatusBadRequest, checkapi.RLQSList{Error: fmt.Sprintf("limit = %q: must be a number from 1 to %d", q, checkapi.RLQSMaxLimit)})
			return
		}
		limit = n
	}
	if s.rlqsBuckets == nil {
		s.rlqsAnswer(w, http.StatusNotFound, checkapi.RLQSList{Error: "this server has no Envoy quota service (envoy.rlqs)"})
		return
	}
	views := s.rlqsViews(limit + 1)
	s.rlqsAnswer(w, http.StatusOK, checkapi.RLQSList{Buckets: views[:min(len(views), limit)], Truncated: len(views) > limit})
}

// rlqsViews returns at most limit buckets of the quota service as the
// wire shows them; nil without one.
func (s *Server) rlqsViews(limit int) []checkapi.RLQSBucketView {
	if s.rlqsBuckets == nil {
		return nil
	}
	views := s.rlqsBuckets(limit)
	out := make([]checkapi.RLQSBucketView, 0, len(views))
	for _, v := range views {
		out = append(out, checkapi.RLQSBucketView{Domain: v.Domain, Policy: v.Policy, Subject: v.Subject, Streams: v.Streams,
			Demand: v.Demand, Rate: v.Rate, Burst: v.Burst, Allowed: v.Allowed, Denied: v.Denied})
	}
	return out
}

func (s *Server) rlqsAnswer(w http.ResponseWriter, code int, list checkapi.RLQSList) {
	if lw, ok := w.(*logWriter); ok && list.Error != "" {
		lw.reason = list.Error
	}
	if list.Buckets == nil {
		list.Buckets = []checkapi.RLQSBucketView{}
	}
	writeJSON(w, code, list)
}
