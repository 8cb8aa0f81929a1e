package redisstore

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestScriptHoldArguments: the script takes a held spend's hold in both
// forms and refuses one it cannot take (not an integer of 0 to 365 days, on
// anything but a spend, or in the short form on an algorithm with no
// held spend) before it reads or writes anything. The engine's Check
// refuses all of these first; this holds the script to its own contract
// when called by anything else.
func TestScriptHoldArguments(t *testing.T) {
	srv, err := redistest.StartServer("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	if err := c.FunctionLoadReplace(ctx, librarySource).Err(); err != nil {
		t.Fatal(err)
	}
	gcra := "5 10 1000000 10 0 0" // 10 per second, burst 10
	general := func(op, hold string) []any {
		// ARGV_COST … ARGV_HOLD, then the policy; on Redis time.
		cost := "5"
		if op == "peek" {
			cost = "0"
		}
		return []any{cost, "", "-1", op, "", "", "", "", "", hold, gcra}
	}
	for _, tc := range []struct {
		name string
		args []any
		want string // "": the reply {0, 1, 10, 2, 800000, 0, now}
	}{
		{"general", general("spend", "300000"), ""},
		{"short", []any{"h", "5", "300000", gcra}, ""},
		{"general, negative", general("spend", "-1"), "SLUICE_ARGS hold must be an integer"},
		{"general, beyond 365 days", general("spend", "31536000000001"), "SLUICE_ARGS hold must be an integer"},
		{"general, a peek", general("peek", "10"), "0 unless the op is spend"},
		{"short, 0", []any{"h", "5", "0", gcra}, "SLUICE_ARGS hold must be an integer of 1"},
		{"short, not a number", []any{"h", "5", "x", gcra}, "SLUICE_ARGS hold must be an integer of 1"},
		{"short, sliding_window", []any{"h", "1", "10", "3 10 1000000 10 0 0"}, "SLUICE_ARGS a held spend does not take a policy of algorithm 3"},
	} {
		key := "{hold-test}" + tc.name
		got, err := c.FCall(ctx, codeName, []string{key}, tc.args...).Int64Slice()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: FCALL %v: %v", tc.name, tc.args, err)
		case tc.want == "" && (len(got) != 7 || got[1] != 1 || got[3] != 2 || got[4] != 800000):
			t.Errorf("%s: FCALL %v = %v, want {0, 1, 10, 2, 800000, 0, now}: allowed, 2 remaining, reset after 800ms, on Redis time", tc.name, tc.args, got)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: FCALL %v = %v, %v; want an error holding %q", tc.name, tc.args, got, err, tc.want)
		case tc.want != "":
			if n, _ := c.Exists(ctx, key).Result(); n != 0 {
				t.Errorf("%s: a refused call wrote %s", tc.name, key)
			}
		}
	}
}
