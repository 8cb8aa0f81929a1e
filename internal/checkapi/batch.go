package checkapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice"
)

// POST /v1/checks takes up to MaxChecks checks in one body, a Batch:
//
//	{"checks":[{"policy":"demo","subject":"alice"},
//	           {"policy":"login","subject":"bob","cost":2}]}
//
// each exactly the Request POST /v1/check takes, and answers 200 with a
// BatchAnswer, one Result per check in the same order: the Answer that
// check alone would have been answered, with the HTTP status it would have
// had as "status":
//
//	{"results":[{"outcome":"allowed",…,"status":200},
//	            {"outcome":"incompatible",…,"reason":"…","status":404}]}
//
// A check that is malformed, names an unknown policy or needs a scope the
// token lacks is its own 400, 404 or 403 among the results; the whole
// request is refused only when its body is not a Batch (400), holds no
// check (400), more than MaxChecks (413) or more bytes than the server's
// bound (413), or its bearer token is not valid (401).
const (
	ChecksPath = "/v1/checks"
	MaxChecks  = 64
)

// Batch is the body of POST /v1/checks. Each check is held as it was
// written, so that one a Request cannot decode is that check's 400 and
// not the whole request's; a client fills Checks with the JSON of
// Requests.
type Batch struct {
	Checks []json.RawMessage `json:"checks"`
}

// Result is one check's part of a BatchAnswer: the Answer POST /v1/check
// would have answered it alone, and Status, that answer's HTTP status.
type Result struct {
	Answer
	Status int `json:"status"`
}

// BatchAnswer is the answer of POST /v1/checks: one Result per check, in
// the request's order.
type BatchAnswer struct {
	Results []Result `json:"results"`
}

// AppendResult appends to b the Result of one check of a batch, answered
// o with reason and HTTP status code: AppendAnswer's object with
// "status" as its last member.
func AppendResult(b []byte, code int, o *sluice.Outcome, reason string) []byte {
	b = AppendAnswer(b, o, reason)
	b = b[:len(b)-2] // "}\n"
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	return append(b, '}')
}

// ParseBatchAnswer decodes raw, the body of a 200 answer of POST
// /v1/checks to want checks, as a BatchAnswer: an error when it is not
// one (not JSON, another number of results, a result without an outcome
// or a status).
func ParseBatchAnswer(raw []byte, want int) (BatchAnswer, error) {
	var a BatchAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		return BatchAnswer{}, fmt.Errorf("checkapi: not a batch answer: %w", err)
	}
	if len(a.Results) != want {
		return BatchAnswer{}, fmt.Errorf("checkapi: not a batch answer: %d results for %d checks", len(a.Results), want)
	}
	for i := range a.Results {
		if a.Results[i].Outcome == "" || a.Results[i].Status == 0 {
			return BatchAnswer{}, errors.New("checkapi: not a batch answer: a result without outcome or status")
		}
	}
	return a, nil
}
