package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary be a hot cell's child, as the command is
// (the hot cells run os.Executable again).
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == childArg {
		if err := runHotChild(context.Background(), os.Args[2], os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString("bench: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// checkLocalRow checks a local-quota row of the allowed cell. A subject
// takes a block only once it was asked at least MinBlock times in each
// of the last three periods of BlockTime in a process, so a machine that
// stalls a process for a period (a loaded CI runner) may run the whole
// row without one: then every decision went to the store, and the row
// says so. When blocks were taken, they admitted, and saved store calls.
func checkLocalRow(t *testing.T, name string, r hotResult) {
	t.Helper()
	if r.Local.Blocks == 0 {
		if r.LocalAdmitted != 0 || float64(r.StoreCalls) < 0.9*float64(r.Decisions) {
			t.Errorf("%s: no block taken, yet %d admitted locally and %d store calls for %d decisions", name, r.LocalAdmitted, r.StoreCalls, r.Decisions)
		}
		t.Logf("%s: no block taken in %d decisions: the processes did not keep the pace local quota waits for", name, r.Decisions)
		return
	}
	if r.LocalAdmitted == 0 {
		t.Errorf("%s: local quota took %d blocks and admitted none from them", name, r.Local.Blocks)
	}
	if r.StoreCalls >= r.Decisions {
		t.Errorf("%s: %d store calls for %d decisions: local quota saved none", name, r.StoreCalls, r.Decisions)
	}
}

// TestHot runs both hot cells briefly, 2 processes × 2 callers, on a
// redis-server the command starts, and checks what they count: nothing
// denied under a limit never reached; every decision of a row without
// local quota one store call at least, as Redis counts them; a local
// quota row admitting from the blocks it took, with fewer store calls
// than decisions (checkLocalRow); and in the reached cell, denials once
// more was offered than the bound (a loaded machine may offer less), and
// no row admitting more than the algorithm's bound over the run.
func TestHot(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not on PATH")
	}
	var out, errs bytes.Buffer
	args := []string{"-hot", "allowed,reached", "-procs", "2", "-callers", "2", "-duration", "400ms", "-warmup", "400ms",
		"-hot-limit", "40", "-hot-window", "100ms", "-json"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, args, &out, &errs); err != nil {
		t.Fatalf("run: %v\n%s", err, errs.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Hot == nil {
		t.Fatal("no hot results")
	}
	rows := map[hotCell]int{}
	for _, r := range rep.Hot.Results {
		rows[r.Cell]++
		name := string(r.Cell) + ", " + r.Limiter
		if r.Errors != 0 || r.Decisions == 0 {
			t.Errorf("%s: %d decisions, %d errors (%s)", name, r.Decisions, r.Errors, r.FirstError)
			continue
		}
		if r.Cell == hotAllowed && r.Denied != 0 {
			t.Errorf("%s: %d denied under a limit never reached", name, r.Denied)
		}
		// Redis's count starts as the measured phase does, give or take
		// the calls in flight: a tenth is slack enough.
		if !r.LocalQuota && float64(r.StoreCalls) < 0.9*float64(r.Decisions) {
			t.Errorf("%s: %d store calls for %d decisions: %v", name, r.StoreCalls, r.Decisions, r.RedisCommands)
		}
		if r.LocalQuota && r.Cell == hotAllowed {
			checkLocalRow(t, name, r)
		}
		if r.Cell == hotReached {
			// Offered 4× the limit when the machine keeps the pace; a
			// loaded one may not even offer the bound (decisions are
			// what was offered), and then nothing need be denied.
			if r.Denied == 0 && float64(r.Decisions) > r.Bound {
				t.Errorf("%s: nothing denied of %d decisions over a bound of %.0f", name, r.Decisions, r.Bound)
			}
			if r.Bound == 0 || float64(r.Allowed) > r.Bound {
				t.Errorf("%s: admitted %d, bound %.0f", name, r.Allowed, r.Bound)
			}
		}
	}
	if rows[hotAllowed] != 6 || rows[hotReached] != 4 {
		t.Errorf("rows per cell: %v, want 6 allowed and 4 reached", rows)
	}
	var md strings.Builder
	hotMarkdown(&md, &rep)
	t.Log("\n" + md.String())
	if !strings.Contains(md.String(), "target ≥ 10×") {
		t.Errorf("the markdown names no target:\n%s", md.String())
	}
}
