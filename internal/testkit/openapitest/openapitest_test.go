package openapitest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Errorf instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestCheckCatchesDrift: Check passes an answer as the document has it,
// and fails one with a renamed field, a request the document forbids
// answered 200, and an undocumented status.
func TestCheckCatchesDrift(t *testing.T) {
	const body = `{"policy":"demo","subject":"alice"}`
	answer := `{"outcome":"allowed","allowed":true,"limit":3,"remaining":2,"reset_after_ms":10000,"retry_after_ms":0,"approximate":false,"reason":"","replayed":false}`
	header := http.Header{"Content-Type": {"application/json"}, "Ratelimit-Policy": {`"demo";q=3;w=10`}, "Ratelimit": {`"demo";r=2;t=10`}, "Cache-Control": {"no-store"}}
	for _, tc := range []struct {
		name, body, answer string
		code               int
		want               string // in the one error; "" none
	}{
		{"as documented", body, answer, 200, ""},
		{"renamed field", body, strings.Replace(answer, `"remaining"`, `"remaining_units"`, 1), 200, "missing property 'remaining'"},
		{"forbidden request allowed", `{"policy":"demo"}`, answer, 200, "the server answered 200 to a request internal/server/openapi.yaml forbids"},
		{"undocumented status", body, answer, 418, "status is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(tc.body))
			Check(rec, req, []byte(tc.body), tc.code, header, []byte(tc.answer))
			switch {
			case tc.want == "" && len(rec.errs) > 0:
				t.Errorf("Check(%s) failed: %q, want no error", tc.name, rec.errs)
			case tc.want != "" && (len(rec.errs) == 0 || !strings.Contains(strings.Join(rec.errs, "\n"), tc.want)):
				t.Errorf("Check(%s) = %q, want an error containing %q", tc.name, rec.errs, tc.want)
			}
		})
	}
}
