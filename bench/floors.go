package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

// The batched floors are the references of the instruction ratios: the
// least a decision's script can do, sent the way sluice sends its own
// (the decisions of many callers that meet while one batch is on the
// wire go to Redis in one round trip), so that the difference to a
// sluice row is the script's weight and nothing else.

// fixedWindowScript is the minimal fixed window: INCR, PEXPIRE when the
// counter is new (ARGV[1]: the window in ms).
const fixedWindowScript = `local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n`

// redisRateScript is go-redis/redis_rate v10's allowN script as that
// module ships it (lua.go, after Pavel Pravosud's redis-gcra): its GCRA
// math and its commands (TIME, GET, SET … EX).
const redisRateScript = `
-- this script has side-effects, so it requires replicate commands mode
redis.replicate_commands()

local rate_limit_key = KEYS[1]
local burst = ARGV[1]
local rate = ARGV[2]
local period = ARGV[3]
local cost = tonumber(ARGV[4])

local emission_interval = period / rate
local increment = emission_interval * cost
local burst_offset = emission_interval * burst

local jan_1_2017 = 1483228800
local now = redis.call("TIME")
now = (now[1] - jan_1_2017) + (now[2] / 1000000)

local tat = redis.call("GET", rate_limit_key)

if not tat then
  tat = now
else
  tat = tonumber(tat)
end

tat = math.max(tat, now)

local new_tat = tat + increment
local allow_at = new_tat - burst_offset

local diff = now - allow_at
local remaining = diff / emission_interval

if remaining < 0 then
  local reset_after = tat - now
  local retry_after = diff * -1
  return {
    0, -- allowed
    0, -- remaining
    tostring(retry_after),
    tostring(reset_after),
  }
end

local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", rate_limit_key, new_tat, "EX", math.ceil(reset_after))
end
local retry_after = -1
return {cost, remaining, tostring(retry_after), tostring(reset_after)}
`

// floorSenders is how many batches may be on the wire at once, as
// redisstore's default Senders.
const floorSenders = 2

// floorCall is one caller's decision in a floorBatcher.
type floorCall struct {
	key  string
	cmd  *redis.Cmd
	done chan struct{}
}

// floorBatcher sends the EVALSHAs of every caller queued while its
// senders are busy in one pipeline.
type floorBatcher struct {
	client *redis.Client
	sha    string
	args   []any
	mu     sync.Mutex
	queue  []*floorCall
	wake   chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
	pool   sync.Pool
}

func newFloorBatcher(c *redis.Client, sha string, args []any) *floorBatcher {
	b := &floorBatcher{client: c, sha: sha, args: args, wake: make(chan struct{}, floorSenders), stop: make(chan struct{})}
	b.pool.New = func() any { return &floorCall{done: make(chan struct{}, 1)} }
	b.wg.Add(floorSenders)
	for range floorSenders {
		go b.send()
	}
	return b
}

// do queues the decision for key and returns its reply.
func (b *floorBatcher) do(key string) (any, error) {
	c := b.pool.Get().(*floorCall)
	c.key = key
	b.mu.Lock()
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	<-c.done
	v, err := c.cmd.Result()
	c.cmd = nil
	b.pool.Put(c)
	return v, err
}

func (b *floorBatcher) send() {
	defer b.wg.Done()
	var batch []*floorCall
	for {
		select {
		case <-b.stop:
			return
		case <-b.wake:
		}
		b.mu.Lock()
		batch, b.queue = b.queue, batch[:0]
		b.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		pipe := b.client.Pipeline()
		for _, c := range batch {
			c.cmd = pipe.EvalSha(ctx, b.sha, []string{c.key}, b.args...)
		}
		pipe.Exec(ctx) // each command holds its own reply or error
		cancel()
		for i, c := range batch {
			c.done <- struct{}{}
			batch[i] = nil
		}
	}
}

func (b *floorBatcher) close() {
	close(b.stop)
	b.wg.Wait()
}

// batchedFloorTargets are the minimal fixed window and redis_rate's GCRA,
// each with the limits sluice's rows of the same algorithm get in the
// allowed mode, one EVALSHA per decision, batched.
func batchedFloorTargets() []target {
	mk := func(name, script, prefix string, args func() []any, allowed func(v any) (bool, error)) target {
		// args and allowed read limits when a cell is built, after -window is parsed.
		return target{
			name: "floor: " + name + ", batched", kind: floor, batch: 1,
			build: func(ctx context.Context, e *env, m mode) (decideFunc, func(), error) {
				sha, err := e.client.ScriptLoad(ctx, script).Result()
				if err != nil {
					return nil, nil, err
				}
				keys := make([]string, len(e.subjects))
				for i, s := range e.subjects {
					keys[i] = prefix + s
				}
				b := newFloorBatcher(e.client, sha, args())
				return func(ctx context.Context, i int) (int, error) {
					v, err := b.do(keys[i])
					if err != nil {
						return 0, err
					}
					ok, err := allowed(v)
					if err != nil || !ok {
						return 0, err
					}
					return 1, nil
				}, b.close, nil
			},
		}
	}
	return []target{
		mk("minimal fixed window (INCR, PEXPIRE on create)", fixedWindowScript, "fw:",
			func() []any {
				_, w := limits(allowedMode, sluice.FixedWindow)
				return []any{w.Milliseconds()}
			},
			func(v any) (bool, error) {
				n, ok := v.(int64)
				if !ok {
					return false, fmt.Errorf("fixed window floor: reply %v", v)
				}
				limit, _ := limits(allowedMode, sluice.FixedWindow)
				return n <= limit, nil
			}),
		mk("redis_rate's GCRA script", redisRateScript, "rate:",
			// redis_rate's own arguments: burst, rate, period in seconds, cost.
			func() []any {
				limit, w := limits(allowedMode, sluice.GCRA)
				return []any{limit, limit, w.Seconds(), 1}
			},
			func(v any) (bool, error) {
				r, ok := v.([]any)
				if !ok || len(r) == 0 {
					return false, fmt.Errorf("gcra floor: reply %v", v)
				}
				n, _ := r[0].(int64)
				return n > 0, nil
			}),
	}
}
