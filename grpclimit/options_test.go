package grpclimit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
)

// TestNewErrors: every invalid option is an error at construction naming
// the option, its value and the rule.
func TestNewErrors(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	lim, err := sluice.New(store, []sluice.Policy{
		slidingLog("api", 5, 10*time.Second),
		slidingLog("local", 5, 10*time.Second),
		{ID: "streams", Algorithm: sluice.Concurrency, Limit: 2, LeaseTTL: time.Minute},
	}, sluice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	method := func(name string, policies ...string) grpclimit.Method {
		return grpclimit.Method{Name: name, Policies: policies}
	}
	tests := []struct {
		name string
		opts grpclimit.Options
		want string
	}{
		{"unknown policy", grpclimit.Options{Methods: []grpclimit.Method{method(echoUnary, "apii")}},
			`grpclimit: Methods[0].Policies[0] = "apii": the limiter has no such policy; it has api, local, streams`},
		{"no policies", grpclimit.Options{Methods: []grpclimit.Method{method(echoUnary)}},
			`grpclimit: Methods[0].Policies = []: at least one policy ID is required`},
		{"policy twice", grpclimit.Options{Methods: []grpclimit.Method{method(echoUnary, "api", "api")}},
			`grpclimit: Methods[0].Policies[1] = "api": is named twice`},
		{"name without a slash", grpclimit.Options{Methods: []grpclimit.Method{method("test.Echo/Unary", "api")}},
			`grpclimit: Methods[0].Name = "test.Echo/Unary": must be a full method name such as "/acme.Orders/Create", or a service such as "/acme.Orders/"`},
		{"service only", grpclimit.Options{Methods: []grpclimit.Method{method("/test.Echo", "api")}},
			`grpclimit: Methods[0].Name = "/test.Echo": must be a full method name`},
		{"too many segments", grpclimit.Options{Methods: []grpclimit.Method{method("/a/b/c", "api")}},
			`grpclimit: Methods[0].Name = "/a/b/c": must be a full method name`},
		{"space", grpclimit.Options{Methods: []grpclimit.Method{method("/test.Echo/Un ary", "api")}},
			`grpclimit: Methods[0].Name = "/test.Echo/Un ary": must be printable ASCII without spaces`},
		{"name twice", grpclimit.Options{Methods: []grpclimit.Method{method("/test.Echo/", "api"), method("/test.Echo/", "streams")}},
			`grpclimit: Methods[1].Name = "/test.Echo/": is named by an earlier rule too`},
		{"negative cost", grpclimit.Options{Methods: []grpclimit.Method{{Name: echoUnary, Policies: []string{"api"}, Cost: -1}}},
			`grpclimit: Methods[0].Cost = -1: must not be negative; leave it 0 for 1`},
		{"cost above max", grpclimit.Options{Methods: []grpclimit.Method{{Name: echoUnary, Policies: []string{"api"}, Cost: 6}}},
			`grpclimit: Methods[0].Cost = 6: must be at most the max cost of policy "api", 5`},
		{"fails local without a fallback", grpclimit.Options{Default: []string{"local"}, FailureMode: failure.Local},
			`grpclimit: Default.FailureMode = local: is local, but Options.Fallback is nil`},
		{"negative deadline", grpclimit.Options{Deadline: -time.Second},
			`grpclimit: Deadline = -1s: must not be negative`},
	}
	for _, tt := range tests {
		_, err := grpclimit.New(lim, tt.opts)
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%s: New = %v, want %q", tt.name, err, tt.want)
		}
	}
	if _, err := grpclimit.New(nil, grpclimit.Options{}); err == nil {
		t.Error("New(nil) = nil error, want one")
	}
	// A cost above a concurrency policy's nothing: a lease is one slot.
	if _, err := grpclimit.New(lim, grpclimit.Options{Methods: []grpclimit.Method{{Name: echoStream, Policies: []string{"streams", "api"}, Cost: 5}}}); err != nil {
		t.Errorf("New with cost 5 on streams and api: %v, want nil", err)
	}
}
