package redisstore_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

// Estimates and settles across real processes on real Redis:
// TestSettleProcesses starts the test binary twice over as
// TestSettleChild, each a Limiter on one Redis spending estimates of 10
// tokens from one subject's 100 per hour (fixed_window) and settling
// them with a random actual cost of 0 to 30, each settle retried once
// with another cost (the retry must answer the same, Replayed, and change
// nothing). The victim, first, leaves every other estimate (its first
// among them) unsettled and is killed (SIGKILL) before it settles them;
// the survivor, started then, settles all of its own. The store's count, read from its key, must then be exactly
// what was admitted (the settled actual costs, plus the unsettled
// estimates, which stay spent), and at most the limit plus what the
// settles declared they charged past their estimates.

const (
	settleChildEnv = "SLUICE_SETTLE_CHILD"
	settleMark     = "settlechild "
	settleLimit    = 100
	settleEstimate = 10
	settleRounds   = 16
)

// settleParams is what a child is told, as JSON in settleChildEnv.
type settleParams struct {
	Redis   string // the standalone server's address
	Subject string
	Victim  bool
	Seed    uint64
}

// settleLine is one line a child prints: what happened to one estimate.
type settleLine struct {
	ID                     string
	Denied, Held           bool  // denied; or spent and never to be settled
	Actual                 int64 // settled at
	Charged, GivenBack     int64
	Ready, Done            bool // the victim holds its estimates; the survivor is through
	RetryReplayed, RetryOK bool
}

// TestSettleChild is the child half of TestSettleProcesses; it runs only
// when that test starts it with settleChildEnv set.
func TestSettleChild(t *testing.T) {
	spec := os.Getenv(settleChildEnv)
	if spec == "" {
		t.Skip("the child half of TestSettleProcesses: runs only when that test starts it")
	}
	if err := settleChild(spec, os.Stdin, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

func settleChild(spec string, stdin io.Reader, stdout io.Writer) error {
	var p settleParams
	if err := json.Unmarshal([]byte(spec), &p); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: p.Redis})
	defer c.Close()
	store, err := redisstore.New(c, redisstore.Options{Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer store.Close()
	lim, err := sluice.New(store, []sluice.Policy{{ID: "tokens", Algorithm: sluice.FixedWindow, Limit: settleLimit, Window: time.Hour, DedupeTTL: time.Hour}}, sluice.Options{})
	if err != nil {
		return err
	}
	say := func(l settleLine) {
		b, _ := json.Marshal(l)
		fmt.Fprintf(stdout, "%s%s\n", settleMark, b)
	}
	ctx := context.Background()
	r := rand.New(rand.NewPCG(p.Seed, 1))
	for i := range settleRounds {
		id := fmt.Sprintf("%v-%d", p.Victim, i)
		req := sluice.Request{Op: sluice.Estimate, Policy: "tokens", Subject: p.Subject, Cost: settleEstimate, EvaluationID: id}
		switch o := lim.Check(ctx, req); o.Kind {
		case sluice.Denied:
			say(settleLine{ID: id, Denied: true})
			continue
		case sluice.Allowed:
		default:
			return fmt.Errorf("estimate %s: %+v", id, o)
		}
		if p.Victim && i%2 == 0 {
			say(settleLine{ID: id, Held: true})
			continue
		}
		actual := r.Int64N(3*settleEstimate + 1)
		req.Op, req.Cost = sluice.Settle, actual
		o := lim.Check(ctx, req)
		if o.Kind != sluice.Allowed {
			return fmt.Errorf("settle %s at %d: %+v", id, actual, o)
		}
		req.Cost = (actual + 7) % (3*settleEstimate + 1) // a retry with another cost
		again := lim.Check(ctx, req)
		say(settleLine{ID: id, Actual: actual, Charged: o.Charged, GivenBack: o.GivenBack,
			RetryReplayed: again.Replayed, RetryOK: again.Kind == sluice.Allowed && again.Status == o.Status})
	}
	if p.Victim {
		say(settleLine{Ready: true})
		_, _ = io.ReadAll(stdin) // until killed
		return nil
	}
	say(settleLine{Done: true})
	return nil
}

// TestSettleProcesses: see the comment at the top of this file.
func TestSettleProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two processes")
	}
	c := standaloneClient(t)
	subj := subject(t)
	type child struct {
		cmd   *exec.Cmd
		lines chan settleLine
		errs  chan error
		stdin io.WriteCloser
	}
	start := func(victim bool) *child {
		spec, _ := json.Marshal(settleParams{Redis: shared.standalone.Addr, Subject: subj, Victim: victim, Seed: rand.Uint64()})
		ch := &child{cmd: exec.Command(os.Args[0], "-test.run=^TestSettleChild$", "-test.count=1"), lines: make(chan settleLine, 100), errs: make(chan error, 1)}
		ch.cmd.Env = append(os.Environ(), settleChildEnv+"="+string(spec), lqGORACE())
		ch.cmd.Stderr = os.Stderr
		var err error
		if ch.stdin, err = ch.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := ch.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(ch.lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if rest, ok := strings.CutPrefix(sc.Text(), settleMark); ok {
					var l settleLine
					if err := json.Unmarshal([]byte(rest), &l); err != nil {
						ch.errs <- err
						return
					}
					ch.lines <- l
				}
			}
		}()
		return ch
	}
	victim := start(true)
	t.Cleanup(func() {
		victim.cmd.Process.Kill()
		victim.cmd.Wait()
	})
	var admitted, charged, held, settled int64
	tally := func(name string, ch *child, last func(settleLine) bool) {
		t.Helper()
		for l := range ch.lines {
			switch {
			case last(l):
				return
			case l.Held:
				admitted += settleEstimate
				held++
			case !l.Denied:
				if !l.RetryReplayed || !l.RetryOK {
					t.Errorf("%s: estimate %s: a retried settle answered otherwise or was not replayed", name, l.ID)
				}
				want := settleLine{Charged: max(l.Actual-settleEstimate, 0), GivenBack: max(settleEstimate-l.Actual, 0)}
				if l.Charged != want.Charged || l.GivenBack != want.GivenBack {
					t.Errorf("%s: estimate %s settled at %d: charged %d, given back %d; want %d, %d", name, l.ID, l.Actual, l.Charged, l.GivenBack, want.Charged, want.GivenBack)
				}
				admitted += l.Actual
				charged += l.Charged
				settled++
			}
		}
		select {
		case err := <-ch.errs:
			t.Fatalf("%s: %v", name, err)
		default:
		}
		t.Fatalf("%s ended before its last line (see its stderr above)", name)
	}
	tally("victim", victim, func(l settleLine) bool { return l.Ready })
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	victim.cmd.Wait()
	survivor := start(false) // after the kill: it spends what the victim's unsettled estimates left
	t.Cleanup(func() {
		survivor.cmd.Process.Kill()
		survivor.cmd.Wait()
	})
	tally("survivor", survivor, func(l settleLine) bool { return l.Done })
	if err := survivor.cmd.Wait(); err != nil {
		t.Fatalf("survivor: %v", err)
	}
	count := settleCount(t, c, subj)
	t.Logf("%d settled, %d held by the killed process, %d tokens admitted, %d charged past estimates; the store counts %d of %d", settled, held, admitted, charged, count, settleLimit)
	if held == 0 || settled == 0 {
		t.Fatalf("held %d, settled %d: want both (the victim holds every other estimate)", held, settled)
	}
	if count != admitted {
		t.Errorf("the store counts %d, want exactly the %d admitted (settled actual costs and unsettled estimates)", count, admitted)
	}
	if admitted > settleLimit+charged {
		t.Errorf("admitted %d, more than the limit %d plus the %d the settles charged", admitted, settleLimit, charged)
	}
}

// settleCount reads the count of subj's fixed window from its key: the
// state's second field (a window's end and count on Redis time), stored
// as the byte 1 and little-endian doubles (codec.lua).
func settleCount(t *testing.T, c *redis.Client, subj string) int64 {
	t.Helper()
	keys, err := c.Keys(context.Background(), "*{"+subj+"}tokens:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		raw, err := c.Get(context.Background(), k).Bytes()
		if err != nil || len(raw) != 1+8*2 || raw[0] != 1 {
			continue // the id keys, a sorted set and a hash
		}
		return int64(math.Float64frombits(binary.LittleEndian.Uint64(raw[9:])))
	}
	t.Fatalf("no fixed-window state among %q", keys)
	return 0
}
