package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/wiring"
)

// checkFlags are the flags of sluice check. Its body is the check API's
// own Request (checkapi): each flag sets one of its fields.
type checkFlags struct {
	base, tokenEnv, caFile, release, renew string
	timeout                                time.Duration
	body                                   checkapi.Request
	path                                   string // checkapi.CheckPath, ReleasePath or RenewPath
}

func (a *app) check(ctx context.Context, args []string) error {
	f, err := a.checkFlags(args)
	if f == nil {
		return err
	}
	token, err := wiring.Token(a.getenv, f.tokenEnv, "")
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("check: %w", err)}
	}
	client, err := wiring.HTTPClient(f.caFile)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("check: %w", err)}
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	url := strings.TrimSuffix(strings.TrimSuffix(f.base, "/"), checkapi.CheckPath) + f.path
	resp, err := wiring.Send(ctx, client, http.MethodPost, url, f.body, token)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("check: %w", err)}
	}
	defer resp.Body.Close()
	return a.printAnswer(resp, url)
}

// checkFlags parses args. It returns nil and the error to return for a
// usage error or after -h (errHelp, wrapped).
func (a *app) checkFlags(args []string) (*checkFlags, error) {
	f := &checkFlags{path: checkapi.CheckPath}
	var policy string
	var cost int64
	fs := newFlagSet("check")
	fs.StringVar(&f.base, "url", "http://127.0.0.1:8080", "the server's base `URL`")
	fs.StringVar(&policy, "policy", "", "the policy `ID` to check; several, comma-separated, are checked together (required)")
	fs.StringVar(&f.body.Subject, "subject", "", "whose budget to spend (required); the server pseudonymizes it")
	fs.Int64Var(&cost, "cost", 1, "units to spend; 0 peeks without spending")
	fs.BoolVar(&f.body.Refund, "refund", false, "give --cost units back instead of spending them")
	fs.BoolVar(&f.body.Reset, "reset", false, "clear the subject's state of the policies (unlock it); takes no --cost")
	fs.StringVar(&f.body.EvaluationID, "evaluation-id", "", "identifies the request across retries")
	fs.StringVar(&f.body.Op, "op", "", "`estimate`: spend --cost as an estimate remembered under --evaluation-id; settle: replace it with the actual --cost; book: spend now or book the next slot, answered with its delay_ms (the check API's \"op\")")
	var maxWait time.Duration
	fs.DurationVar(&maxWait, "max-wait", 0, "with --op book: the longest to wait for the slot, whole milliseconds (default: the policy's max_wait)")
	fs.StringVar(&f.body.Priority, "priority", "", "the request's priority `class`, one the policies declare (the check API's \"priority\")")
	fs.StringVar(&f.release, "release", "", "give back the lease `ID` a check of a concurrency policy answered (POST /v1/release)")
	fs.StringVar(&f.renew, "renew", "", "extend the lease `ID` a check of a concurrency policy answered by its lease_ttl (POST /v1/renew)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "give up after this long")
	fs.StringVar(&f.tokenEnv, "token-env", "", "send the bearer token held by the environment variable `NAME` (the server's server.auth)")
	fs.StringVar(&f.caFile, "ca-file", "", "trust the PEM certificates in `FILE` for an https:// URL, besides the system's")
	if err := a.parseFlags(fs, checkSynopsis, args); err != nil {
		return nil, &exitError{code: 2, err: err} // errHelp after -h: run answers nil
	}
	switch {
	case policy == "" || f.body.Subject == "":
		return nil, &exitError{code: 2, err: &usageError{msg: "check needs --policy and --subject", usage: "Usage: " + checkSynopsis + "\n"}}
	case f.release != "" && f.renew != "":
		return nil, &exitError{code: 2, err: &usageError{msg: "check: set --release or --renew, not both", usage: "Usage: " + checkSynopsis + "\n"}}
	}
	if ids := strings.Split(policy, ","); len(ids) > 1 {
		f.body.Policies = ids
	} else {
		f.body.Policy = policy
	}
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "cost" {
			f.body.Cost = &cost
		}
	})
	if maxWait != 0 {
		ms := maxWait.Milliseconds()
		if maxWait%time.Millisecond != 0 || ms < 1 {
			return nil, &exitError{code: 2, err: &usageError{msg: fmt.Sprintf("check: --max-wait %v: must be a whole number of milliseconds, 1ms or more", maxWait), usage: "Usage: " + checkSynopsis + "\n"}}
		}
		f.body.MaxWaitMS = &ms
	}
	switch {
	case f.release != "":
		f.path, f.body.LeaseID = checkapi.ReleasePath, f.release
	case f.renew != "":
		f.path, f.body.LeaseID = checkapi.RenewPath, f.renew
	}
	return f, nil
}

// printAnswer prints the check API's answer in resp and returns the exit
// status it means: nil (0) allowed, 1 denied, 2 anything else.
func (a *app) printAnswer(resp *http.Response, url string) error {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("check: read answer: %w", err)}
	}
	answer, err := checkapi.ParseAnswer(raw)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("check: %s from %s: %w", resp.Status, url, err)}
	}
	a.stdout.Write(raw)
	if len(raw) > 0 && raw[len(raw)-1] != '\n' {
		io.WriteString(a.stdout, "\n")
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusTooManyRequests:
		return &exitError{code: 1}
	}
	return &exitError{code: 2, err: fmt.Errorf("check: %s: %s: %s", resp.Status, answer.Outcome, answer.Reason)}
}
