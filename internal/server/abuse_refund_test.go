package server_test

import (
	"testing"
)

// TestAbuseRefund plays refunds: a client without the refund scope is
// refused (403) and gives nothing back; one with it gives back at most
// what was spent: whatever it sends, no policy is left with more than
// its limit, so what may be spent afterwards is at most the limit.
func TestAbuseRefund(t *testing.T) {
	var rows []abuseRow
	for _, id := range []string{"fw", "cal", "sl", "tb", "gc"} {
		spend3 := `{"policy":"` + id + `","subject":%[1]q,"cost":3}`
		refund10 := `{"policy":"` + id + `","subject":%[1]q,"cost":10,"refund":true}`
		rows = append(rows,
			abuseRow{name: "refunds past the limit, " + id, token: abuseRefund, before: []string{spend3}, body: refund10, times: 3,
				code: 200, admitted: 3, left: map[string]int64{id: 10}},
			abuseRow{name: "spends after refunds past the limit, " + id, before: []string{spend3, refund10, refund10},
				body: `{"policy":"` + id + `","subject":%[1]q}`, times: 11, code: 429, admitted: 10, left: map[string]int64{id: 0}},
			abuseRow{name: "spends after refunds of nothing spent, " + id, before: []string{refund10, refund10},
				body: `{"policy":"` + id + `","subject":%[1]q}`, times: 11, code: 429, admitted: 10, left: map[string]int64{id: 0}},
		)
	}
	spent := []string{`{"policy":"fw","subject":%[1]q,"cost":4}`}
	rows = append(rows, []abuseRow{
		{name: "a check token refunds", before: spent, body: `{"policy":"fw","subject":%[1]q,"cost":4,"refund":true}`, code: 403, reason: `token "app" lacks scope refund`, left: map[string]int64{"fw": 6}, still: true},
		{name: "a reset token refunds", token: abuseReset, before: spent, body: `{"policy":"fw","subject":%[1]q,"cost":4,"refund":true}`, code: 403, reason: `token "unlock" lacks scope refund`, left: map[string]int64{"fw": 6}, still: true},
		{name: "a refund above max_cost", token: abuseRefund, before: spent, body: `{"policy":"fw","subject":%[1]q,"cost":11,"refund":true}`, code: 422, reason: "cost = 11: cost above policy maximum 10", left: map[string]int64{"fw": 6}, still: true},
		{name: "a refund of sliding_window", token: abuseRefund, body: `{"policy":"sw","subject":%[1]q,"cost":1,"refund":true}`, code: 422, reason: "refund not supported by sliding_window", still: true},
		{name: "a refund of a lease", token: abuseRefund, body: `{"policy":"conc","subject":%[1]q,"refund":true}`, code: 422, reason: "release the lease instead", still: true},
		{name: "a refund of nothing", token: abuseRefund, before: spent, body: `{"policy":"fw","subject":%[1]q,"cost":0,"refund":true}`, code: 400, reason: "a refund gives back a cost of 1 or more", left: map[string]int64{"fw": 6}, still: true},
		{name: "a negative refund", token: abuseRefund, before: spent, body: `{"policy":"fw","subject":%[1]q,"cost":-4,"refund":true}`, code: 400, reason: "cost = -4: must not be negative", left: map[string]int64{"fw": 6}, still: true},
		{name: "a retried refund gives back once", token: abuseRefund, before: spent, body: `{"policy":"fw","subject":%[1]q,"cost":2,"refund":true,"evaluation_id":"r-1"}`, times: 4,
			code: 200, admitted: 4, left: map[string]int64{"fw": 8}},
	}...)
	onBothStores(t, func(t *testing.T, h *hostile) { playRows(t, h, rows) })
}

// TestAbuseReset plays resets: only a token with the reset scope clears
// state; it clears the named subject's state of the named policies and
// nothing else, and takes no cost or evaluation id.
func TestAbuseReset(t *testing.T) {
	spent := []string{`{"policy":"fw","subject":%[1]q,"cost":10}`, `{"policy":"tb","subject":%[1]q,"cost":10}`}
	rows := []abuseRow{
		{name: "a check token resets", before: spent, body: `{"policy":"fw","subject":%[1]q,"reset":true}`, code: 403, reason: `token "app" lacks scope reset`, left: map[string]int64{"fw": 0}, still: true},
		{name: "a refund token resets", token: abuseRefund, before: spent, body: `{"policy":"fw","subject":%[1]q,"reset":true}`, code: 403, reason: `token "ops" lacks scope reset`, left: map[string]int64{"fw": 0}, still: true},
		{name: "a reset clears the named policy only", token: abuseReset, before: spent, body: `{"policy":"fw","subject":%[1]q,"reset":true}`, code: 200, left: map[string]int64{"fw": 10, "tb": 0}},
		{name: "a reset clears the named subject only", token: abuseReset, before: spent, body: `{"policy":"fw","subject":"%[1]s, another","reset":true}`, code: 200, left: map[string]int64{"fw": 0, "tb": 0}},
		{name: "a reset of rates and leases", token: abuseReset, before: append(spent, `{"policy":"conc","subject":%[1]q}`, `{"policy":"conc","subject":%[1]q}`),
			body: `{"policies":["fw","tb","conc"],"subject":%[1]q,"reset":true}`, code: 200, left: map[string]int64{"fw": 10, "tb": 10, "conc": 2}},
		{name: "a reset with a cost", token: abuseReset, before: spent, body: `{"policy":"fw","subject":%[1]q,"reset":true,"cost":5}`, code: 400, reason: "cost = 5: a reset takes no cost", left: map[string]int64{"fw": 0}, still: true},
		{name: "a reset with an evaluation id", token: abuseReset, before: spent, body: `{"policy":"fw","subject":%[1]q,"reset":true,"evaluation_id":"x"}`, code: 400, reason: "a reset takes no evaluation id", left: map[string]int64{"fw": 0}, still: true},
		{name: "a reset that refunds", token: abuseReset, before: spent, body: `{"policy":"fw","subject":%[1]q,"reset":true,"refund":true,"cost":1}`, code: 400, reason: "set refund or reset, not both", left: map[string]int64{"fw": 0}, still: true},
		{name: "a reset of an unknown policy", token: abuseReset, before: spent, body: `{"policies":["fw","nope"],"subject":%[1]q,"reset":true}`, code: 404, reason: `policies[1] "nope"`, left: map[string]int64{"fw": 0}, still: true},
	}
	onBothStores(t, func(t *testing.T, h *hostile) { playRows(t, h, rows) })
}
