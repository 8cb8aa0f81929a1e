package main

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisInfo is what one INFO cpu stats commandstats call tells.
type redisInfo struct {
	cpuUS    float64          // used_cpu_user + used_cpu_sys, µs
	commands int64            // total_commands_processed
	reads    int64            // total_reads_processed
	writes   int64            // total_writes_processed
	calls    map[string]int64 // commandstats calls per command, e.g. "evalsha"
}

func readInfo(ctx context.Context, c *redis.Client) (redisInfo, error) {
	text, err := c.Info(ctx, "cpu", "stats", "commandstats").Result()
	if err != nil {
		return redisInfo{}, fmt.Errorf("INFO: %w", err)
	}
	ri := redisInfo{calls: map[string]int64{}}
	for _, line := range strings.Split(text, "\r\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case name == "used_cpu_user" || name == "used_cpu_sys":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return ri, fmt.Errorf("INFO %s: %w", line, err)
			}
			ri.cpuUS += f * 1e6
		case name == "total_commands_processed":
			ri.commands, _ = strconv.ParseInt(v, 10, 64)
		case name == "total_reads_processed":
			ri.reads, _ = strconv.ParseInt(v, 10, 64)
		case name == "total_writes_processed":
			ri.writes, _ = strconv.ParseInt(v, 10, 64)
		case strings.HasPrefix(name, "cmdstat_"):
			// cmdstat_evalsha:calls=12,usec=…
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			n, _ := strconv.ParseInt(calls, 10, 64)
			ri.calls[strings.TrimPrefix(name, "cmdstat_")] = n
		}
	}
	return ri, nil
}

// scriptCommands are the commands that run a script; their commandstats
// calls count script invocations, not what the scripts call inside.
var scriptCommands = []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}

// memoryPerSubject returns the MEMORY USAGE, summed, and the names of the
// keys on a server that holds one subject's state and nothing else.
func memoryPerSubject(ctx context.Context, c *redis.Client) (int64, []string, error) {
	var keys []string
	var cursor uint64
	for range 1000 { // bounded: one subject has a handful of keys
		ks, next, err := c.Scan(ctx, cursor, "*", 1000).Result()
		if err != nil {
			return 0, nil, fmt.Errorf("SCAN: %w", err)
		}
		keys = append(keys, ks...)
		if cursor = next; cursor == 0 {
			break
		}
	}
	var total int64
	for _, k := range keys {
		n, err := c.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			return 0, nil, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
		}
		total += n
	}
	return total, keys, nil
}

// lookRedis finds redis-server on PATH, or names the flag that sets it.
func lookRedis(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found on PATH (install it, or pass -redis-server PATH): %w", err)
	}
	return p, nil
}
