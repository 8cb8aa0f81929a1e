package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redisreply"
)

// refusedBeforeRun are error replies with which Redis refuses a script
// before it runs, or at its first write (nothing written yet: the script
// writes only after every read and check).
var refusedBeforeRun = []string{
	"NOSCRIPT", "NOPERM", "NOAUTH", "WRONGPASS", "CROSSSLOT", "CLUSTERDOWN",
	"MOVED", "ASK", "TRYAGAIN", "LOADING", "BUSY", "MASTERDOWN", "READONLY",
	"OOM", "MISCONF", "NOREPLICAS", "MAXCLIENTS",
}

// classifyRead is classify for round trips that only read: nothing was
// spent, whatever happened, so what classify calls Indeterminate is
// FailedBeforeSend (Unavailable: the breaker counts it all the same).
func (s *Store) classifyRead(ctx context.Context, what string, err error) error {
	if err = s.classify(ctx, what, err); errors.Is(err, sluice.ErrIndeterminate) {
		return fmt.Errorf("redisstore: %s: %w: %v", what, sluice.FailedBeforeSend, err)
	}
	return err
}

// classify wraps err, from doing what, in the sentinel that types it.
func (s *Store) classify(ctx context.Context, what string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && !errors.Is(err, redis.ErrPoolTimeout) && !errors.Is(err, redis.ErrClosed) {
		msg := rerr.Error()
		code, reason, _ := strings.Cut(msg, " ")
		if sentinel := scriptError(code); sentinel == sluice.ErrInvalidRequest {
			// Worded as the engine words its Go twin's refusal (memstore's):
			// the rule, without the script's code.
			return fmt.Errorf("redisstore: %w", fmt.Errorf("%w: %s", sentinel, reason))
		} else if sentinel != nil {
			return fmt.Errorf("redisstore: %s: %w", msg, sentinel)
		}
		for _, c := range refusedBeforeRun {
			if code == c {
				return fmt.Errorf("redisstore: %s: redis refused: %s: %w", what, msg, sluice.FailedBeforeSend)
			}
		}
		return fmt.Errorf("redisstore: %s: %s: %w", what, msg, sluice.ErrIndeterminate)
	}
	var op *net.OpError
	switch {
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed):
		return fmt.Errorf("redisstore: %s: %w: %w", what, sluice.FailedBeforeSend, err)
	case errors.As(err, &op) && op.Op == "dial":
		return fmt.Errorf("redisstore: %s: %w: %w", what, sluice.FailedBeforeSend, err)
	case errors.As(err, &op) && op.Op == "write":
		// A failed write left the command incomplete on the wire: a Redis
		// server executes only complete commands.
		return fmt.Errorf("redisstore: %s: %w: %w", what, sluice.FailedBeforeSend, err)
	case op == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && ctx.Err() != nil:
		// go-redis returns a bare context error only while waiting for a
		// connection, dialling or setting a new one up (a Redis that
		// accepts and never answers); a read cut short by the deadline is
		// a *net.OpError timeout. The deadline is the store's (Timeout),
		// not the caller's: Redis failed to take the command in time.
		return fmt.Errorf("redisstore: %s: nothing sent within the store's timeout (%v): %w", what, err, sluice.FailedBeforeSend)
	}
	return fmt.Errorf("redisstore: %s: %w: %w", what, sluice.ErrIndeterminate, err)
}

// reloadFailed is the error of a decision whose node did not hold the
// code (cause) and could not load it: refused, so nothing ran, and not
// sent again.
func reloadFailed(cause, err error) error {
	return fmt.Errorf("redisstore: reload after %s: %v: %w", redisreply.Error(cause), err, sluice.FailedBeforeSend)
}

// typeErr types err, the error of what (a decision's command), by what it
// shows. An error reply is Redis's own answer (classify). Otherwise
// whether the command was written decides: one never written failed
// before send, or returns the context error when its caller cancelled;
// one written got no reply and may have run: Indeterminate, whether its
// connection failed or a deadline (the store's or its caller's) cut the
// wait short.
func (s *Store) typeErr(ctx context.Context, what string, written bool, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && !errors.Is(err, redis.ErrPoolTimeout) && !errors.Is(err, redis.ErrClosed) {
		return s.classify(ctx, what, err)
	}
	if !written {
		if errors.Is(ctx.Err(), context.Canceled) {
			return fmt.Errorf("redisstore: %s: nothing sent: %w", what, context.Canceled)
		}
		return fmt.Errorf("redisstore: %s: nothing sent (%v): %w", what, err, sluice.FailedBeforeSend)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "write" {
		// A failed write left the command incomplete on the wire: a Redis
		// server executes only complete commands.
		return fmt.Errorf("redisstore: %s: %w: %w", what, sluice.FailedBeforeSend, err)
	}
	return fmt.Errorf("redisstore: %s: sent, no reply: %w: %w", what, sluice.ErrIndeterminate, err)
}
