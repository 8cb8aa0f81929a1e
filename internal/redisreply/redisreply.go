// Package redisreply reads what a Redis error reply says about the code
// sluice runs there (redisstore's decisions, the RLQS ledger's claims):
// whether the node lacks it or will not run it as a function, so the call
// certainly did not run and may be sent again once the code is loaded.
package redisreply

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// NotLoaded reports whether err says the node does not hold the code, or
// cannot run it as a function (before Redis 7, or a user not allowed
// FCALL, whether the caller has not learnt it yet or the user lost
// +fcall at run time), so the call certainly did not run.
func NotLoaded(err error) bool {
	msg := Error(err)
	return strings.HasPrefix(msg, "NOSCRIPT") || strings.HasPrefix(msg, "ERR Function not found") || NoFunctions(msg)
}

// NoFunctions reports whether msg, an error reply to FCALL, says the node
// will not run functions for this user: FCALL unknown (before Redis 7) or
// not permitted.
func NoFunctions(msg string) bool {
	return strings.HasPrefix(msg, "ERR unknown command 'fcall'") || strings.HasPrefix(msg, "ERR unknown command `fcall`") ||
		strings.HasPrefix(msg, "NOPERM") && strings.Contains(msg, "'fcall'")
}

// Error returns the error reply err carries, "" when it is none.
func Error(err error) string {
	var re redis.Error
	if errors.As(err, &re) {
		return re.Error()
	}
	return ""
}
