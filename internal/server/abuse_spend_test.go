package server_test

import (
	"fmt"
	"strings"
	"testing"
)

// full is what every rate policy of abuseConfig has left for a subject
// nothing was spent for.
func full() map[string]int64 {
	m := map[string]int64{}
	for _, id := range rateIDs {
		m[id] = 10
	}
	return m
}

// TestAbuseSpend plays a client of the check scope sending spends no
// honest client sends: past the limit, costs negative, huge or not
// numbers, policies twice or 65 of them, oversized bodies. The bound:
// at most the limit is admitted, a refused spend writes nothing, and each
// malformed request is refused naming its field.
func TestAbuseSpend(t *testing.T) {
	var rows []abuseRow
	for _, id := range rateIDs {
		rows = append(rows, abuseRow{
			name: "cost 3 until refused, " + id, body: `{"policy":"` + id + `","subject":%[1]q,"cost":3}`, times: 10,
			code: 429, admitted: 3, left: map[string]int64{id: 1},
		})
	}
	many := append([]string{}, rateIDs...)
	for i := len(many); i < 65; i++ {
		many = append(many, fmt.Sprintf("p%d", i))
	}
	nothing := full()
	rows = append(rows, []abuseRow{
		{name: "cost above max_cost", body: `{"policy":"fw","subject":%[1]q,"cost":11}`, code: 422, reason: "cost = 11: cost above policy maximum 10", left: nothing, still: true},
		{name: "cost at int64's most", body: `{"policy":"gc","subject":%[1]q,"cost":9223372036854775807}`, code: 422, reason: "cost above policy maximum 10", left: nothing, still: true},
		{name: "cost past int64", body: `{"policy":"tb","subject":%[1]q,"cost":9223372036854775808}`, code: 400, reason: "Request.cost of type int64", left: nothing, still: true},
		{name: "negative cost", body: `{"policy":"sl","subject":%[1]q,"cost":-1}`, code: 400, reason: "cost = -1: must not be negative", left: nothing, still: true},
		{name: "fractional cost", body: `{"policy":"fw","subject":%[1]q,"cost":0.5}`, code: 400, reason: "Request.cost of type int64", left: nothing, still: true},
		{name: "cost as a string", body: `{"policy":"fw","subject":%[1]q,"cost":"5"}`, code: 400, reason: "Request.cost of type int64", left: nothing, still: true},
		{name: "a policy named twice", body: `{"policies":["fw","tb","fw"],"subject":%[1]q}`, code: 400, reason: `policies[2] "fw" is named twice`, left: nothing, still: true},
		{name: "65 policies", body: `{"policies":["` + strings.Join(many, `","`) + `"],"subject":%[1]q}`, code: 404, reason: `policies[6] "p6"`, left: nothing, still: true},
		{name: "all or nothing", before: []string{`{"policy":"gc","subject":%[1]q,"cost":8}`}, body: `{"policies":["fw","sl","gc"],"subject":%[1]q,"cost":3}`, times: 5,
			code: 429, admitted: 0, left: map[string]int64{"fw": 10, "sl": 10, "gc": 2}, still: true},
		{name: "a retried evaluation id spends once", body: `{"policy":"fw","subject":%[1]q,"cost":4,"evaluation_id":"retry-1"}`, times: 5, code: 200, admitted: 5, left: map[string]int64{"fw": 6}},
		{name: "a body over 64 KiB", body: `{"policy":"fw","subject":%[1]q,"evaluation_id":"` + strings.Repeat("x", 64<<10) + `"}`, code: 400, reason: "request body is larger than 65536 bytes", left: nothing, still: true},
		{name: "a subject over 1024 bytes", body: `{"policy":"fw","subject":"` + strings.Repeat("s", 1025) + `%.0[1]s","cost":1}`, code: 400, reason: "subject is 1025 bytes: must be at most 1024", still: true},
		{name: "a field of its own", body: `{"policy":"fw","subject":%[1]q,"limit":1000}`, code: 400, reason: `unknown field "limit"`, left: nothing, still: true},
		{name: "two bodies in one", body: `{"policy":"fw","subject":%[1]q}{"policy":"fw","subject":%[1]q}`, code: 400, reason: "more than one value", left: nothing, still: true},
		{name: "an unknown policy", body: `{"policy":"unlimited","subject":%[1]q}`, code: 404, reason: `policy "unlimited"`, still: true},
		{name: "no token", token: noToken, body: `{"policy":"fw","subject":%[1]q}`, code: 401, reason: "a valid bearer token is required", left: nothing, still: true},
	}...)
	onBothStores(t, func(t *testing.T, h *hostile) { playRows(t, h, rows) })
}

// TestAbusePeek plays a client of the check scope peeking (an explicit
// cost of 0) whatever it sends along: the bound is that a peek changes
// nothing, on any policy, any number of times; what would make it more
// than a peek is refused.
func TestAbusePeek(t *testing.T) {
	var rows []abuseRow
	for _, id := range append(rateIDs, "conc") {
		want := map[string]int64{id: 10}
		if id == "conc" {
			want[id] = 2
		}
		rows = append(rows, abuseRow{name: "50 peeks of " + id, body: `{"policy":"` + id + `","subject":%[1]q,"cost":0}`, times: 50, code: 200, admitted: 50, left: want, still: true})
	}
	rows = append(rows, []abuseRow{
		{name: "peeks of every policy at once", body: `{"policies":["` + strings.Join(append(rateIDs, "conc"), `","`) + `"],"subject":%[1]q,"cost":0}`, times: 20,
			code: 200, admitted: 20, left: full(), still: true},
		{name: "peeks of a spent budget", before: []string{`{"policy":"fw","subject":%[1]q,"cost":10}`}, body: `{"policy":"fw","subject":%[1]q,"cost":0}`, times: 20,
			code: 429, admitted: 0, left: map[string]int64{"fw": 0}, still: true},
		{name: "a peek's evaluation id is not remembered", before: []string{`{"policy":"fw","subject":%[1]q,"cost":0,"evaluation_id":"same"}`},
			body: `{"policy":"fw","subject":%[1]q,"cost":2,"evaluation_id":"same"}`, code: 200, left: map[string]int64{"fw": 8}},
		{name: "a peek that refunds", body: `{"policy":"fw","subject":%[1]q,"cost":0,"refund":true}`, code: 400, reason: "a peek or a refund, not both", left: full(), still: true},
		{name: "a peek that resets", body: `{"policy":"fw","subject":%[1]q,"cost":0,"reset":true}`, code: 403, reason: `token "app" lacks scope reset`, still: true},
		{name: "a peek that names a lease", body: `{"policy":"conc","subject":%[1]q,"cost":0,"lease_id":"abc"}`, code: 400, reason: "lease_id belongs to POST /v1/release", left: map[string]int64{"conc": 2}, still: true},
		{name: "a peek that waits", body: `{"policy":"gc","subject":%[1]q,"cost":0,"max_wait_ms":1000}`, code: 400, reason: "only a book waits", left: full(), still: true},
	}...)
	onBothStores(t, func(t *testing.T, h *hostile) { playRows(t, h, rows) })
}
