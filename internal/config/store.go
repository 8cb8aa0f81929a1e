package config

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Store types.
const (
	StoreMemory = "memory" // the embedded store (memstore)
	StoreRedis  = "redis"  // Redis, standalone, Sentinel or Cluster (redisstore)
)

// Redis modes used with Redis.Addrs.
const (
	ModeCluster  = "cluster"
	ModeSentinel = "sentinel"
)

// Store selects and configures the store.
type Store struct {
	// Type is StoreMemory or StoreRedis. Default: StoreMemory.
	Type string
	// Redis configures the Redis connection; required for StoreRedis and
	// nil otherwise.
	Redis *Redis
	// Memory configures the embedded store; nil when absent (its bound is
	// then derived from the process's memory limit, see MaxKeys), and
	// only with StoreMemory.
	Memory *Memory
}

// The range of Memory.MaxKeys.
const (
	MinMaxKeys = 1000
	MaxMaxKeys = 1_000_000_000
)

// Memory configures the embedded store (memstore).
type Memory struct {
	// MaxKeys bounds the (subject, policy) states held, and separately the
	// remembered evaluation ids (memstore.Options.MaxKeys: at the bound,
	// expired entries go first, then those whose loss gives away least).
	// MinMaxKeys to MaxMaxKeys. 0: derived from GOMEMLIMIT when it is set
	// (half of it over 1400 bytes per state and its id), else memstore's
	// default of 1 000 000.
	MaxKeys int64
}

// Redis says how to reach Redis: either URL (one server) or Addrs with a
// Mode.
type Redis struct {
	// URL is a redis:// or rediss:// URL, e.g. "redis://127.0.0.1:6379/0".
	URL string
	// Addrs are host:port seeds of a cluster or the sentinels.
	Addrs []string
	// Mode is ModeCluster or ModeSentinel; required with Addrs.
	Mode string
	// MasterName is the Sentinel master; required with ModeSentinel.
	MasterName string
	// Username is the ACL user, if any.
	Username string
	// UsernameFile names a file holding the ACL user, read again when it
	// changes, as PasswordFile is; not with Username.
	UsernameFile string
	// PasswordEnv names the environment variable holding the password.
	PasswordEnv string
	// PasswordFile names a file holding the password (a mounted
	// Kubernetes Secret, say), read at start and again whenever it
	// changes (its size or modification time), before each new
	// connection: a rotated password is used without a restart, by the
	// connections opened after it; those open keep theirs until Redis
	// drops them. Trailing line breaks are dropped; at most 64 KiB. Not
	// with PasswordEnv.
	PasswordFile string
	// Timeout bounds each round trip of decisions to Redis, 1ms to 1m;
	// past it they are undecidable and the failure mode answers. 0: the
	// store's default (1s).
	Timeout time.Duration
	// DialTimeout bounds opening a connection, 1ms to 1m. 0: go-redis's
	// default (5s).
	DialTimeout time.Duration
	// PoolSize is the most connections to each Redis node, 1 to 10000.
	// Decisions that meet share pipelines, so few are needed. 0:
	// go-redis's default (10 per CPU).
	PoolSize int64
	// WaitReplicas, 0 to 16, has every decision acknowledged by that many
	// replicas before it is answered (redisstore.Options.WaitReplicas):
	// for limits where an over-admission after a failover matters, at
	// about twice the latency; a decision fewer replicas acknowledged is
	// indeterminate. Not with a Ring. 0: no wait.
	WaitReplicas int64
}

// Password returns the password from the environment variable named by
// PasswordEnv, via getenv; "" when PasswordEnv is unset.
func (r *Redis) Password(getenv func(string) string) (string, error) {
	if r == nil || r.PasswordEnv == "" {
		return "", nil
	}
	pw := getenv(r.PasswordEnv)
	if pw == "" {
		return "", &Error{Path: "store.redis.password_env", Value: strconv.Quote(r.PasswordEnv), Rule: "environment variable " + r.PasswordEnv + " is not set or empty"}
	}
	return pw, nil
}

// checkRedisURL returns the rule a redis:// URL breaks, or "": the
// scheme, the host and port, and the database number, each named.
func checkRedisURL(raw string) string {
	const example = "such as redis://127.0.0.1:6379/0"
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) && strings.Contains(ue.Err.Error(), "invalid port") {
			return "the port must be a number between 1 and 65535, " + example
		}
		return "must be a redis:// or rediss:// URL, " + example + ": " + strings.TrimPrefix(err.Error(), "parse "+strconv.Quote(raw)+": ")
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return "must be a redis:// or rediss:// URL, " + example
	}
	if u.Hostname() == "" {
		return "must name a host, " + example
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return "the port must be a number between 1 and 65535, " + example
		}
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		if n, err := strconv.ParseUint(db, 10, 31); err != nil {
			return fmt.Sprintf("the database number %q must be a whole number such as 0, %s", db, example)
		} else if n > 1<<20 {
			return fmt.Sprintf("the database number %d is out of range, %s", n, example)
		}
	}
	return ""
}

func (c *Config) validateStore() *Error {
	s := c.Store
	switch s.Type {
	case StoreMemory:
		if s.Redis != nil {
			return c.errorAt("store.redis", "", "applies only to store.type redis")
		}
		if m := s.Memory; m != nil && (m.MaxKeys < MinMaxKeys || m.MaxKeys > MaxMaxKeys) {
			return c.errorAt("store.memory.max_keys", strconv.FormatInt(m.MaxKeys, 10), fmt.Sprintf("must be between %d and %d", MinMaxKeys, MaxMaxKeys))
		}
		return nil
	case StoreRedis:
		if s.Memory != nil {
			return c.errorAt("store.memory", "", "applies only to store.type memory")
		}
	default:
		return c.errorAt("store.type", strconv.Quote(s.Type), "must be one of memory, redis")
	}
	r := s.Redis
	if r == nil {
		return c.errorAt("store.redis", "", "is required when store.type is redis")
	}
	switch {
	case r.URL != "" && len(r.Addrs) > 0:
		return c.errorAt("store.redis.addrs", "", "set url or addrs, not both")
	case r.URL == "" && len(r.Addrs) == 0:
		return c.errorAt("store.redis", "", "needs url (one server) or addrs with mode cluster or sentinel")
	case r.URL != "":
		if rule := checkRedisURL(r.URL); rule != "" {
			return c.errorAt("store.redis.url", strconv.Quote(r.URL), rule)
		}
		if r.Mode != "" {
			return c.errorAt("store.redis.mode", strconv.Quote(r.Mode), "applies only with addrs; a url names one server")
		}
	default:
		for i, a := range r.Addrs {
			if rule := checkHostPort(a, false); rule != "" {
				return c.errorAt(fmt.Sprintf("store.redis.addrs[%d]", i), strconv.Quote(a), rule)
			}
		}
		if r.Mode == "" {
			return c.errorAt("store.redis.mode", "", "is required with addrs: cluster or sentinel")
		}
		if r.Mode != ModeCluster && r.Mode != ModeSentinel {
			return c.errorAt("store.redis.mode", strconv.Quote(r.Mode), "must be one of cluster, sentinel")
		}
	}
	if r.Mode == ModeSentinel && r.MasterName == "" {
		return c.errorAt("store.redis.master_name", "", "is required with mode sentinel")
	}
	if r.Mode != ModeSentinel && r.MasterName != "" {
		return c.errorAt("store.redis.master_name", strconv.Quote(r.MasterName), "applies only to mode sentinel")
	}
	if r.PasswordEnv != "" && !validEnvName(r.PasswordEnv) {
		return c.errorAt("store.redis.password_env", strconv.Quote(r.PasswordEnv), envNameRule)
	}
	if r.PasswordEnv != "" && r.PasswordFile != "" {
		return c.errorAt("store.redis.password_file", strconv.Quote(r.PasswordFile), "set password_env or password_file, not both")
	}
	if r.Username != "" && r.UsernameFile != "" {
		return c.errorAt("store.redis.username_file", strconv.Quote(r.UsernameFile), "set username or username_file, not both")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"timeout", r.Timeout}, {"dial_timeout", r.DialTimeout}} {
		if d.v != 0 && (d.v < time.Millisecond || d.v > time.Minute) {
			return c.errorAt("store.redis."+d.field, d.v.String(), "must be between 1ms and 1m")
		}
	}
	if r.PoolSize < 0 || r.PoolSize > 10000 {
		return c.errorAt("store.redis.pool_size", strconv.FormatInt(r.PoolSize, 10), "must be between 1 and 10000")
	}
	if r.WaitReplicas < 0 || r.WaitReplicas > 16 {
		return c.errorAt("store.redis.wait_replicas", strconv.FormatInt(r.WaitReplicas, 10), "must be between 0 and 16")
	}
	return nil
}

func (d *decoder) store(s *Store, n *yaml.Node) {
	m, ok := d.mapping("store", n, "type", "redis", "memory")
	if !ok {
		return
	}
	d.str("store.type", m["type"], &s.Type)
	if v := m["memory"]; v != nil {
		if mm, ok := d.mapping("store.memory", v, "max_keys"); ok {
			s.Memory = &Memory{}
			d.int("store.memory.max_keys", mm["max_keys"], &s.Memory.MaxKeys)
		}
	}
	v := m["redis"]
	if v == nil {
		return
	}
	const p = "store.redis"
	rm, ok := d.mapping(p, v, "url", "addrs", "mode", "master_name", "username", "username_file", "password_env", "password_file", "timeout", "dial_timeout", "pool_size", "wait_replicas")
	if !ok {
		return
	}
	r := &Redis{}
	d.str(p+".url", rm["url"], &r.URL)
	d.strs(p+".addrs", rm["addrs"], &r.Addrs)
	d.str(p+".mode", rm["mode"], &r.Mode)
	d.str(p+".master_name", rm["master_name"], &r.MasterName)
	d.str(p+".username", rm["username"], &r.Username)
	d.str(p+".password_env", rm["password_env"], &r.PasswordEnv)
	d.str(p+".username_file", rm["username_file"], &r.UsernameFile)
	d.str(p+".password_file", rm["password_file"], &r.PasswordFile)
	d.duration(p+".timeout", rm["timeout"], &r.Timeout)
	d.duration(p+".dial_timeout", rm["dial_timeout"], &r.DialTimeout)
	d.int(p+".pool_size", rm["pool_size"], &r.PoolSize)
	d.int(p+".wait_replicas", rm["wait_replicas"], &r.WaitReplicas)
	s.Redis = r
}
