package redisreply

import (
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
)

// reply is an error reply as go-redis returns one.
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

var _ redis.Error = reply("")

func TestNotLoaded(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{reply("NOSCRIPT No matching script. Please use EVAL."), true},
		{reply("ERR Function not found"), true},
		{reply("ERR unknown command 'fcall', with args beginning with: "), true},
		{reply("ERR unknown command `fcall`, with args beginning with: "), true},
		{reply("NOPERM User sluice has no permissions to run the 'fcall' command"), true},
		{fmt.Errorf("redisstore: run: %w", reply("NOSCRIPT No matching script.")), true},
		{reply("NOPERM User sluice has no permissions to access the 'x' key"), false},
		{reply("ERR some other error"), false},
		{errors.New("NOSCRIPT but not a reply"), false},
		{nil, false},
	} {
		if got := NotLoaded(c.err); got != c.want {
			t.Errorf("NotLoaded(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
