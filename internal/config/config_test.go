package config_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/failure"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/subject"
)

// invalid maps each fixture under testdata/invalid to the exact error
// Parse must return for it.
var invalid = []struct {
	file string
	want string
}{
	{"priorities_share_too_big.yaml", "policies[0].priorities.sheddable: \"150%\": must be between 1% and 100% of the policy's capacity (line 8)"},
	{"priorities_not_percent.yaml", "policies[0].priorities.sheddable: \"half\": must be the share of the policy's capacity this class may use, in whole percent, e.g. 50% (line 7)"},
	{"priorities_bad_class.yaml", "policies[0].priorities: \"Bulk\": a class name is 1 to 32 characters of a-z 0-9 _ - (line 6)"},
	{"priorities_no_unit_left.yaml", "policies[0].priorities.sheddable: \"20%\": leaves this class no unit of the policy's capacity of 3: raise the share to at least 34% (line 7)"},
	{"proxy_priority_undeclared.yaml", "proxy.routes[0].priority: \"bulk\": must be a class one of the route's policies declares under priorities, or default (line 12)"},
	{"proxy_priority_header_untrusted.yaml", "proxy.routes[0].priority_header: \"X-Priority\": is believed only from proxy.trusted_proxies, and none are set: a client could name itself critical (line 13)"},
	{"period_with_window.yaml", "policies[0].window: \"720h\": must not be set with a period: the period is the window (line 6)"},
	{"period_unknown.yaml", "policies[0].period: \"fortnight\": must be one of minute, hour, day, week, month, year (line 5)"},
	{"period_token_bucket.yaml", "policies[0].period: \"month\": token_bucket refills continuously: a refill of limit per month is no calendar quota (nothing resets when the month begins, and its rate would change with the month's length); use fixed_window for a quota per month, or a window for a rate (line 5)"},
	{"time_zone_unknown.yaml", "policies[0].time_zone: \"Europe/Atlantis\": must be an IANA time zone name such as Europe/Berlin, America/New_York or UTC (line 6)"},
	{"time_zone_without_period.yaml", "policies[0].time_zone: \"Europe/Berlin\": applies only with a period; set period, or leave time_zone unset (line 6)"},
	{"bad_failure_mode.yaml", "policies[0].failure_mode: \"fail_open\": must be one of closed, open, local (line 6)"},
	{"bad_listen.yaml", "server.listen: \"localhost\": must be host:port, such as 127.0.0.1:8080 (line 2)"},
	{"bad_listen_port.yaml", "server.listen: \"127.0.0.1:http\": must be host:port, such as 127.0.0.1:8080; the port must be a number between 0 and 65535 (line 2)"},
	{"bad_policy_id.yaml", "policies[0].id: \"log in\": must be 1 to 64 characters of A-Z a-z 0-9 _ . - (line 2)"},
	{"bad_store_type.yaml", "store.type: \"memcached\": must be one of memory, redis (line 2)"},
	{"burst_on_fixed_window.yaml", "policies[0].burst: 5: applies only to token_bucket and gcra; leave it unset for fixed_window (line 6)"},
	{"burst_zero.yaml", "policies[0].burst: 0: must not be zero; leave it out for the default (line 6)"},
	{"concurrency_limit_too_big.yaml", "policies[0].limit: 200000: concurrency keeps one entry per lease and allows at most 100000 (line 4)"},
	{"concurrency_missing_lease_ttl.yaml", "policies[0].lease_ttl: is required for concurrency: how long a lease lives if never released, e.g. 30s (line 2)"},
	{"concurrency_with_window.yaml", "policies[0].window: \"1m\": does not apply to concurrency, which limits leases held at once; set lease_ttl, how long a lease lives if never released (line 6)"},
	{"lease_ttl_not_duration.yaml", "policies[0].lease_ttl: \"forever\": must be a duration such as 10s, 1m or 1h30m (line 5)"},
	{"lease_ttl_on_fixed_window.yaml", "policies[0].lease_ttl: \"30s\": applies only to concurrency; leave it unset for fixed_window (line 6)"},
	{"lease_ttl_too_long.yaml", "policies[0].lease_ttl: \"48h\": must be between 1ms and 24h (line 5)"},
	{"lease_ttl_zero.yaml", "policies[0].lease_ttl: \"0s\": must be between 1ms and 24h: concurrency requires it, how long a lease lives if never released (line 5)"},
	{"cleanup_grace_too_long.yaml", "policies[0].cleanup_grace: \"2h\": must be between 0s and 1h (line 6)"},
	{"envoy_max_descriptors_too_big.yaml", "envoy.max_descriptors: 100000: must be between 1 and 10000 (line 9)"},
	{"dedupe_max_too_big.yaml", "policies[0].dedupe_max: 20000: must be between 1 and 10000 (line 6)"},
	{"dedupe_max_zero.yaml", "policies[0].dedupe_max: 0: must not be zero; leave it out for the default (line 6)"},
	{"max_wait_on_fixed_window.yaml", "policies[0].max_wait: \"1s\": applies only to token_bucket and gcra, which have a future slot to book; leave it unset for fixed_window (line 6)"},
	{"max_wait_too_long.yaml", "policies[0].max_wait: \"25h\": must be between 0s and 24h0m0s (at most 24h, and the units booked ahead must stay exact below 2^53) (line 7)"},
	{"max_wait_zero.yaml", "policies[0].max_wait: \"0s\": must not be zero; leave it out for the default (line 7)"},
	{"dedupe_ttl_too_long.yaml", "policies[0].dedupe_ttl: \"2h\": must be a whole number of milliseconds between 1ms and 1h (line 6)"},
	{"default_burst_too_big.yaml", "policies[0].burst: 1000000000 (the default): burst × window in µs must stay below 2^53; at this window the burst can be at most 104249 (line 2)"},
	{"document_is_list.yaml", "the config must be a mapping, not a list (line 1)"},
	{"duplicate_key.yaml", "policies[0].limit: is set twice (first at line 4) (line 6)"},
	{"duplicate_policy_id.yaml", "policies[1].id: \"demo\": is already the id of policies[0] (line 6)"},
	{"empty.yaml", "the config is empty: it needs at least one thing to serve: policies, a proxy: section or an envoy: section (line 1)"},
	{"empty_policies.yaml", "policies: is empty, and the config needs at least one thing to serve: policies, a proxy: section or an envoy: section (line 1)"},
	{"envoy_bad_listen.yaml", "envoy.listen: \"8081\": must be host:port, such as 127.0.0.1:8080 (line 7)"},
	{"envoy_bad_pattern.yaml", "envoy.configs[0]: \"ratelimit/[.yaml\": must be a file path or glob pattern such as ratelimit/*.yaml (line 8)"},
	{"envoy_listen_same_as_proxy.yaml", "envoy.listen: \"127.0.0.1:8090\": must differ from server.listen and proxy.listen (line 12)"},
	{"hmac_bad_id.yaml", "subjects.hmac_keys[0].id: \"Key-1\": must be 1 to 16 of a-z 0-9 (line 8)"},
	{"hmac_duplicate_id.yaml", "subjects.hmac_keys[1].id: \"k2\": is already the id of subjects.hmac_keys[0] (line 9)"},
	{"align_unknown.yaml", "policies[0].align: \"midnight\": must be one of clock (windows start on the UTC boundaries of the window's length), first_request (the default: a window opens at its first admitted request) (line 6)"},
	{"align_token_bucket.yaml", "policies[0].align: \"clock\": applies only to fixed_window, the one algorithm with windows to align; leave it unset for token_bucket (line 6)"},
	{"hmac_missing_secret_env.yaml", "subjects.hmac_keys[0].secret_env: is required (line 8)"},
	{"hmac_secret_in_file.yaml", "subjects.hmac_keys[0].secret_env: is required (line 8)\nsubjects.hmac_keys[0].secret: unknown key: must be one of id, secret_env (line 9)"},
	{"invalid_yaml.yaml", "invalid YAML: did not find expected '-' indicator (line 4, column 4)"},
	{"limit_fraction.yaml", "policies[0].limit: 2.5: must be an integer, not a float (line 4)"},
	{"limit_not_integer.yaml", "policies[0].limit: \"ten\": must be an integer, not a string (line 4)"},
	{"limit_zero.yaml", "policies[0].limit: 0: must be between 1 and 1000000000 (line 4)"},
	{"max_cost_too_high.yaml", "policies[0].max_cost: 4: must be between 1 and 3, the most fixed_window can admit at once (line 6)"},
	{"merge_key_in_policy.yaml", "policies[0]: <<: keys must be plain names; merge keys (<<) and complex keys are not supported (line 3)"},
	{"missing_id.yaml", "policies[0].id: is required (line 2)"},
	{"missing_window.yaml", "policies[0].window: is required (or a period: minute, hour, day, week, month, year) (line 2)"},
	{"local_quota_sliding_log.yaml", "policies[0].local_quota: true: does not apply to sliding_log: a block's entries would have to be dated after the log's newest write; use gcra or token_bucket for a hot subject (line 6)"},
	{"local_quota_bad_numbers.yaml", "policies[0].local_quota.block_time: \"2s\": must be between 1ms and 1s, at most half the window and the time to refill half the burst (500ms), a whole number of microseconds (line 7)\npolicies[0].local_quota.max_block: 900: must be between 4 and 500, half of max_cost (line 8)"},
	{"local_quota_small_limit.yaml", "policies[0].local_quota: true: needs a max_cost of at least 8, not 3: a limit this small is best decided by the store, one request at a time (line 6)"},
	{"local_quota_zeros.yaml", "policies[0].local_quota.block_time: \"0s\": must not be zero; leave it out for the default (line 7)\npolicies[0].local_quota.max_block: 0: must not be zero; leave it out for the default (line 8)"},
	{"local_quota_unknown_key.yaml", "policies[0].local_quota.block: unknown key: must be one of block_time, max_block (line 7)"},
	{"near_cache_not_bool.yaml", "policies[0].near_cache: \"yes\": must be true or false, not a string (line 6)"},
	{"no_policies.yaml", "the config needs at least one thing to serve: policies, a proxy: section or an envoy: section (line 1)"},
	{"policies_not_list.yaml", "policies: must be a list, not a mapping (line 2)"},
	{"policy_id_not_string.yaml", "policies[0].id: 42: must be a string, not an integer; quote it (line 2)"},
	{"policy_not_mapping.yaml", "policies[0]: \"demo\": must be a mapping, not a scalar (line 2)"},
	{"proxy_bad_cidr.yaml", "proxy.trusted_proxies[1]: \"10.0.0.300/8\": must be a CIDR such as 10.0.0.0/8 or ::1/128 (line 8)"},
	{"proxy_bad_listen.yaml", "proxy.listen: \"8090\": must be host:port, such as 127.0.0.1:8080 (line 7)"},
	{"proxy_bad_method.yaml", "proxy.routes[0].match.methods[0]: \"post\": must be an upper-case HTTP method such as GET or POST (line 9)"},
	{"proxy_bad_path_prefix.yaml", "proxy.routes[0].match.path_prefix: \"login\": must start with \"/\" (line 9)"},
	{"proxy_bad_subject.yaml", "proxy.routes[0].subject: \"cookie\": must be one of ip, ip+user_agent, header:<Name> (line 11)"},
	{"proxy_settle_bucket_debt.yaml", "proxy.routes[0].policies[0]: \"tokens\": cannot settle on it: policy \"tokens\": invalid request: an estimate on token_bucket: a settle carries up to a full bucket of debt, so 2 × burst × window in µs must stay below 2^53; at this window the burst can be at most 142 (line 11)"},
	{"proxy_settle_sliding_window.yaml", "proxy.routes[0].policies[0]: \"tokens\": is a sliding_window policy: a route with settle_header spends estimates, which only fixed_window, sliding_log, token_bucket and gcra can settle (line 11)"},
	{"proxy_estimate_without_settle_header.yaml", "proxy.routes[0].estimate: 300: applies only with settle_header: what a request spends before its upstream reports its cost (line 12)"},
	{"proxy_max_delay_fixed_window.yaml", "proxy.routes[0].max_delay: \"500ms\": policy \"pages\" is fixed_window: only gcra and token_bucket have a future slot to book; a denial's Retry-After is its answer (line 12)"},
	{"proxy_max_delay_past_max_wait.yaml", "proxy.routes[0].max_delay: \"2s\": is more than policy \"paced\"'s max_wait (1s), which bounds every booking: raise its max_wait (line 12)"},
	{"proxy_queue_limit_without_max_delay.yaml", "proxy.routes[0].queue_limit: 50: applies only with max_delay: how many requests are held at once (line 12)"},
	{"proxy_estimate_above_max_cost.yaml", "proxy.routes[0].estimate: 3000: must be at most the max_cost of policy \"tokens\", 1000 (line 13)"},
	{"proxy_bad_upstream.yaml", "proxy.upstream: \"127.0.0.1:9000\": must be an http:// or https:// URL with a host, such as http://127.0.0.1:9000 (line 7)"},
	{"proxy_duplicate_match.yaml", "proxy.routes[1].match: matches what proxy.routes[0] matches (GET /api): the first matching route wins, so this one would never apply (line 11)"},
	{"proxy_listen_same_as_server.yaml", "proxy.listen: \"0.0.0.0:8080\": must differ from server.listen: the proxy has an address of its own (line 8)"},
	{"proxy_local_share_not_number.yaml", "proxy.local_share: \"10%\": must be a number, not a string (line 8)"},
	{"proxy_local_share_too_big.yaml", "proxy.local_share: 1.5: must be more than 0 and at most 1, such as 0.25 for four proxy instances (line 8)"},
	{"proxy_local_share_zero.yaml", "proxy.local_share: 0: must be more than 0 and at most 1, such as 0.25 for four proxy instances (line 8)"},
	{"redis_timeout.yaml", "store.redis.timeout: \"2m\": must be between 1ms and 1m (line 5)"},
	{"redis_password_env_and_file.yaml", "store.redis.password_file: \"/run/secrets/redis\": set password_env or password_file, not both (line 6)"},
	{"redis_username_and_file.yaml", "store.redis.username_file: \"/run/secrets/redis-user\": set username or username_file, not both (line 6)"},
	{"redis_wait_replicas.yaml", "store.redis.wait_replicas: 17: must be between 0 and 16 (line 5)"},
	{"proxy_decision_timeout.yaml", "proxy.decision_timeout: \"30s\": must be between 1ms and 10s (line 6)"},
	{"server_decision_timeout.yaml", "server.decision_timeout: \"0s\": must be between 1ms and 10s (line 3)"},
	{"proxy_no_routes.yaml", "proxy.routes: at least one route is required (line 6)"},
	{"proxy_route_without_match.yaml", "proxy.routes[0].match: is required (line 9)"},
	{"proxy_unknown_policy.yaml", "proxy.routes[0].policies[1]: \"login\": is not the id of any policy (line 10)"},
	{"redis_addrs_without_mode.yaml", "store.redis.mode: is required with addrs: cluster or sentinel (line 3)"},
	{"redis_bad_addr.yaml", "store.redis.addrs[1]: \"10.0.0.2\": must be host:port, such as 127.0.0.1:8080 (line 4)"},
	{"redis_bad_password_env.yaml", "store.redis.password_env: \"$REDIS_PASSWORD\": must be the name of an environment variable: A-Z a-z 0-9 _, not starting with a digit (line 5)"},
	{"redis_bad_url.yaml", "store.redis.url: \"http://127.0.0.1:6379/0\": must be a redis:// or rediss:// URL, such as redis://127.0.0.1:6379/0 (line 4)"},
	{"redis_bad_port.yaml", "store.redis.url: \"redis://127.0.0.1:notaport/0\": the port must be a number between 1 and 65535, such as redis://127.0.0.1:6379/0 (line 4)"},
	{"redis_bad_database.yaml", "store.redis.url: \"redis://127.0.0.1:6379/sessions\": the database number \"sessions\" must be a whole number such as 0, such as redis://127.0.0.1:6379/0 (line 4)"},
	{"redis_url_without_host.yaml", "store.redis.url: \"redis:///0\": must name a host, such as redis://127.0.0.1:6379/0 (line 4)"},
	{"auth_bad_scope.yaml", "server.auth.tokens[0].scopes[1]: \"superuser\": must be one of check, refund, reset, admin (line 5)"},
	{"auth_no_tokens.yaml", "server.auth.tokens: at least one token is required; leave out server.auth for an open check API (line 2)"},
	{"auth_token_without_scopes.yaml", "server.auth.tokens[0].scopes: is required (line 4)"},
	{"auth_duplicate_token_id.yaml", "server.auth.tokens[1].id: \"app\": is already the id of server.auth.tokens[0] (line 5)"},
	{"tls_without_key.yaml", "server.tls.key_file: is required with server.tls: the PEM private key file (line 2)"},
	{"several_errors.yaml", "server.listen: \"localhost\": must be host:port, such as 127.0.0.1:8080 (line 2)\npolicies[0].limit: 0: must be between 1 and 1000000000 (line 6)\npolicies[1].algorithm: \"leaky_bucket\": must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency (line 9)"},
	{"several_errors_in_one_policy.yaml", "policies[0].limit: \"ten\": must be an integer, not a string (line 4)\npolicies[0].window: 10: must be a duration with a unit, such as 10s, 1m or 1h30m (line 5)"},
	{"several_decode_errors.yaml", "policies[0].limit: \"ten\": must be an integer, not a string (line 4)\npolicies[1].windw: unknown key: must be one of id, revision, algorithm, limit, window, lease_ttl, burst, max_cost, failure_mode, cleanup_grace, dedupe_ttl, dedupe_max, near_cache, align, local_quota, period, time_zone, priorities, max_wait (did you mean window?) (line 9)"},
	{"redis_master_name_without_sentinel.yaml", "store.redis.master_name: \"mymaster\": applies only to mode sentinel (line 6)"},
	{"redis_password_in_file.yaml", "store.redis.password: unknown key: must be one of url, addrs, mode, master_name, username, username_file, password_env, password_file, timeout, dial_timeout, pool_size, wait_replicas (line 5)"},
	{"redis_section_with_memory.yaml", "store.redis: applies only to store.type redis (line 2)"},
	{"memory_max_keys_too_small.yaml", "store.memory.max_keys: 500: must be between 1000 and 1000000000 (line 4)"},
	{"memory_max_keys_not_integer.yaml", "store.memory.max_keys: 1e6: must be an integer, not a float (line 4)"},
	{"memory_section_with_redis.yaml", "store.memory: applies only to store.type memory (line 5)"},
	{"redis_sentinel_without_master.yaml", "store.redis.master_name: is required with mode sentinel (line 3)"},
	{"redis_url_and_addrs.yaml", "store.redis.addrs: set url or addrs, not both (line 5)"},
	{"redis_without_section.yaml", "store.redis: is required when store.type is redis (line 1)"},
	{"revision_negative.yaml", "policies[0].revision: -1: must be between 1 and 2147483648 (line 6)"},
	{"revision_zero.yaml", "policies[0].revision: 0: must not be zero; leave it out for the default (line 6)"},
	{"server_empty.yaml", "server: must be a mapping, not empty (line 1)"},
	{"sliding_log_too_long.yaml", "policies[0].limit: 200000: sliding_log keeps one entry per unit and allows at most 100000; use sliding_window for larger limits (line 4)"},
	{"tabs.yaml", "invalid YAML: found character that cannot start any token (line 2, column 1)"},
	{"two_documents.yaml", "only one YAML document is allowed (line 6)"},
	{"unknown_algorithm.yaml", "policies[0].algorithm: \"leaky_bucket\": must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency (line 4)"},
	{"unknown_policy_key.yaml", "policies[0].windw: unknown key: must be one of id, revision, algorithm, limit, window, lease_ttl, burst, max_cost, failure_mode, cleanup_grace, dedupe_ttl, dedupe_max, near_cache, align, local_quota, period, time_zone, priorities, max_wait (did you mean window?) (line 5)"},
	{"unknown_top_key.yaml", "listen: unknown key: must be one of server, store, policies, subjects, proxy, envoy, telemetry, overrides (line 6)"},
	{"telemetry_endpoint_not_url.yaml", "telemetry.endpoint: \"127.0.0.1:4317\": must be the collector's URL, http://host:port or https://host:port, such as http://127.0.0.1:4317 (line 2)"},
	{"telemetry_bad_protocol_and_ratio.yaml", "telemetry.protocol: \"thrift\": must be one of grpc, http (line 3)\ntelemetry.sampling_ratio: 1.5: must be between 0 and 1 (line 4)"},
	{"telemetry_without_endpoint.yaml", "telemetry.endpoint: is required: the collector's URL, such as http://127.0.0.1:4317 (line 1)"},
	{"window_bad_duration.yaml", "policies[0].window: \"10 seconds\": must be a duration such as 10s, 1m or 1h30m (line 5)"},
	{"window_sub_microsecond.yaml", "policies[0].window: \"1500ns\": must be a whole number of microseconds (line 5)"},
	{"window_too_long.yaml", "policies[1].window: \"8761h\": must be between 1ms and 365 days (8760h) (line 14)"},
	{"window_without_unit.yaml", "policies[0].window: 10: must be a duration with a unit, such as 10s, 1m or 1h30m (line 5)"},
	{"issue_mixed.yaml", "policies[1].algorithm: \"leaky_bucket\": must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency (line 9)\npolicies[2].limit: -100: must be between 1 and 1000000000 (line 14)\npolicies[2].burts: unknown key: must be one of id, revision, algorithm, limit, window, lease_ttl, burst, max_cost, failure_mode, cleanup_grace, dedupe_ttl, dedupe_max, near_cache, align, local_quota, period, time_zone, priorities, max_wait (did you mean burst?) (line 16)"},
	{"duplicate_id_and_type_errors.yaml", "policies[1].id: \"demo\": is already the id of policies[0] (line 6)\npolicies[2].limit: \"lots\": must be an integer, not a string (line 12)"},
	{"route_unknown_policies.yaml", "policies[0].near_cache: \"yes\": must be true or false, not a string (line 6)\nproxy.routes[0].policies[0]: \"login\": is not the id of any policy (line 11)\nproxy.routes[0].policies[2]: \"signup\": is not the id of any policy (line 11)"},
	{"several_rules_one_policy.yaml", "policies[0].revision: -1: must be between 1 and 2147483648 (line 3)\npolicies[0].cleanup_grace: \"2h\": must be between 0s and 1h (line 7)\npolicies[0].dedupe_max: 20000: must be between 1 and 10000 (line 8)"},
	{"misindented.yaml", "invalid YAML: did not find expected '-' indicator (line 5, column 4)"},
	{"ten_mistakes.yaml", "server.listen: \"localhost\": must be host:port, such as 127.0.0.1:8080 (line 2)\nserver.decision_timeout: \"30s\": must be between 1ms and 10s (line 3)\nstore.type: \"memcached\": must be one of memory, redis (line 5)\npolicies[0].limit: 0: must be between 1 and 1000000000 (line 9)\npolicies[1].id: \"demo\": is already the id of policies[0] (line 11)\npolicies[1].algorithm: \"leaky_bucket\": must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency (line 12)\npolicies[2].burts: unknown key: must be one of id, revision, algorithm, limit, window, lease_ttl, burst, max_cost, failure_mode, cleanup_grace, dedupe_ttl, dedupe_max, near_cache, align, local_quota, period, time_zone, priorities, max_wait (did you mean burst?) (line 19)\npolicies[2].near_cache: \"maybe\": must be true or false, not a string (line 20)\nproxy.upstream: \"127.0.0.1:9000\": must be an http:// or https:// URL with a host, such as http://127.0.0.1:9000 (line 22)\nproxy.routes[0].policies[0]: \"login\": is not the id of any policy (line 25)"},
}

// TestTenMistakes checks that ten independent mistakes of every kind
// (syntax aside: wrong types, unknown keys, broken ranges, duplicate ids,
// a route naming an unknown policy) come out as ten errors in one pass,
// sorted by line, each naming its line.
func TestTenMistakes(t *testing.T) {
	_, err := config.Load(filepath.Join("testdata", "invalid", "ten_mistakes.yaml"))
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Load(ten_mistakes.yaml) = %v, want config.Errors", err)
	}
	if len(errs) != 10 {
		t.Fatalf("Load(ten_mistakes.yaml) reported %d errors, want 10:\n%v", len(errs), err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 10 {
		t.Errorf("the error has %d lines, want 10:\n%v", len(lines), err)
	}
	for i, e := range errs {
		if e.Line == 0 || e.Path == "" || e.Rule == "" {
			t.Errorf("error %d = %+v, want a path, a rule and a line", i, e)
		}
		if i > 0 && e.Line < errs[i-1].Line {
			t.Errorf("error %d at line %d after one at line %d: not sorted by line", i, e.Line, errs[i-1].Line)
		}
	}
}

func TestParseInvalid(t *testing.T) {
	covered := map[string]bool{}
	for _, tc := range append(invalid, invalidRLQS...) {
		covered[tc.file] = true
		t.Run(strings.TrimSuffix(tc.file, ".yaml"), func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", "invalid", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			c, err := config.Parse(f)
			if err == nil {
				t.Fatalf("Parse(%s) = %+v, nil; want error %q", tc.file, c, tc.want)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("Parse(%s) error\n got: %s\nwant: %s", tc.file, got, tc.want)
			}
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Errorf("Parse(%s) error is %T, want *config.Error", tc.file, err)
			}
		})
	}
	files, err := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !covered[filepath.Base(f)] {
			t.Errorf("fixture %s has no row in the invalid table", f)
		}
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join("testdata", "invalid", "unknown_algorithm.yaml")
	_, err := config.Load(path)
	want := path + `: policies[0].algorithm: "leaky_bucket": must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency (line 4)`
	if err == nil || err.Error() != want {
		t.Fatalf("Load(%s) error = %v, want %s", path, err, want)
	}
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Path != "policies[0].algorithm" || ce.Line != 4 {
		t.Errorf("Load(%s) error = %#v, want *config.Error at policies[0].algorithm line 4", path, ce)
	}
	if _, err := config.Load(filepath.Join("testdata", "no_such_file.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing file) error = %v, want os.ErrNotExist", err)
	}
}

func TestDefault(t *testing.T) {
	def := config.Default()
	if err := def.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	got, err := config.Load(filepath.Join("testdata", "valid", "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(def, got, cmpopts.IgnoreUnexported(config.Config{})); diff != "" {
		t.Errorf("testdata/valid/default.yaml differs from Default() (-Default +file):\n%s", diff)
	}
	demo := def.Policies[0]
	if demo.ID != "demo" || demo.Algorithm != sluice.FixedWindow || demo.Limit != 3 || demo.Window != 10*time.Second {
		t.Errorf("Default().Policies[0] = %+v, want demo fixed_window 3 per 10s", demo)
	}
}

func TestParseAligned(t *testing.T) {
	got, err := config.Load(filepath.Join("testdata", "valid", "aligned.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Policies) != 2 || !got.Policies[0].ClockAligned || got.Policies[1].ClockAligned {
		t.Fatalf("Load(aligned.yaml).Policies = %+v, want daily aligned to the clock, burst not", got.Policies)
	}
}

func TestParsePeriod(t *testing.T) {
	got, err := config.Load(filepath.Join("testdata", "valid", "period.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Policies) != 2 {
		t.Fatalf("Load(period.yaml).Policies = %+v, want 2", got.Policies)
	}
	plan, daily := got.Policies[0], got.Policies[1]
	if plan.Period != "month" || plan.TimeZone == nil || plan.TimeZone.String() != "Europe/Berlin" || plan.Window != 0 {
		t.Errorf("Load(period.yaml).Policies[0] = %+v, want a month in Europe/Berlin and no window", plan.Policy)
	}
	if daily.Period != "day" || daily.TimeZone != nil {
		t.Errorf("Load(period.yaml).Policies[1] = %+v, want a day in UTC (no time zone)", daily.Policy)
	}
}

func TestParseLocalQuota(t *testing.T) {
	got, err := config.Load(filepath.Join("testdata", "valid", "local_quota.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := []sluice.LocalQuota{{Enabled: true}, {Enabled: true, BlockTime: 50 * time.Millisecond, MaxBlock: 500}}
	for i, p := range got.Policies {
		if p.LocalQuota != want[i] {
			t.Errorf("Load(local_quota.yaml).Policies[%d].LocalQuota = %+v, want %+v", i, p.LocalQuota, want[i])
		}
	}
}

func TestParseFull(t *testing.T) {
	got, err := config.Load(filepath.Join("testdata", "valid", "full.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	api := config.Policy{
		Policy:      sluice.Policy{ID: "api", Revision: 2, Algorithm: sluice.GCRA, Limit: 100, Window: time.Second, Burst: 20, MaxCost: 10, CleanupGrace: 30 * time.Second, DedupeTTL: 10 * time.Second, DedupeMax: 1000, NearCache: true},
		FailureMode: failure.Open,
	}
	want := &config.Config{
		Server: config.Server{
			Listen:          "0.0.0.0:0",
			DecisionTimeout: 750 * time.Millisecond,
			TLS:             &config.TLS{CertFile: "/etc/sluice/tls.crt", KeyFile: "/etc/sluice/tls.key"},
			Auth: &config.Auth{Tokens: []config.Token{
				{ID: "app", SecretEnv: "SLUICE_TOKEN_APP", Scopes: []string{"check"}},
				{ID: "ops", SecretEnv: "SLUICE_TOKEN_OPS", Scopes: []string{"check", "refund"}},
			}},
		},
		Store: config.Store{Type: config.StoreRedis, Redis: &config.Redis{
			Addrs: []string{"10.0.0.1:6379", "10.0.0.2:6379"}, Mode: config.ModeSentinel, MasterName: "mymaster",
			Username: "sluice", PasswordEnv: "SLUICE_REDIS_PASSWORD", Timeout: 250 * time.Millisecond, DialTimeout: 2 * time.Second, PoolSize: 8, WaitReplicas: 1,
		}},
		Policies: []config.Policy{
			{Policy: sluice.Policy{ID: "login", Algorithm: sluice.SlidingLog, Limit: 5, Window: time.Minute}},
			api,
			{Policy: sluice.Policy{ID: "quota", Algorithm: sluice.SlidingWindow, Limit: 600, Window: time.Minute}, FailureMode: failure.Local},
			{Policy: sluice.Policy{ID: "bucket", Algorithm: sluice.TokenBucket, Limit: 2, Window: time.Second, Burst: 10}},
			{Policy: sluice.Policy{ID: "reports", Algorithm: sluice.Concurrency, Limit: 2, LeaseTTL: 30 * time.Second}},
		},
		Subjects: config.Subjects{HMACKeys: []config.HMACKey{{ID: "k2", SecretEnv: "SLUICE_HMAC_K2"}, {ID: "k1", SecretEnv: "SLUICE_HMAC_K1"}}},
		Proxy: &config.Proxy{
			Listen:          "0.0.0.0:8000",
			LocalShare:      0.25,
			DecisionTimeout: 250 * time.Millisecond,
			ReadTimeout:     config.DefaultProxyReadTimeout,
			Upstream:        "http://127.0.0.1:9000",
			TrustedProxies:  []string{"10.0.0.0/8", "::1/128"},
			Routes: []config.Route{
				{Match: config.Match{PathPrefix: "/login", Methods: []string{"POST"}}, Policies: []string{"login"}, Subject: "ip"},
				{Match: config.Match{PathPrefix: "/api/"}, Policies: []string{"api", "quota"}, Subject: "header:X-Api-Key", Shadow: true},
				{Match: config.Match{PathPrefix: "/"}, Policies: []string{"bucket", "reports"}, Subject: "ip+user_agent"},
			},
		},
		Envoy: &config.Envoy{Listen: "127.0.0.1:8081", Configs: []string{"ratelimit/*.yaml"}, MaxDescriptors: 16, MaxEntries: 8},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(config.Config{})); diff != "" {
		t.Errorf("Load(full.yaml) mismatch (-want +got):\n%s", diff)
	}
	if line := got.Line("proxy"); line != 58 {
		t.Errorf("Line(proxy) = %d, want 58", line)
	}
	env := map[string]string{"SLUICE_TOKEN_APP": "app-token-0123456789", "SLUICE_TOKEN_OPS": "short"}
	_, err = got.Tokens(lookup(env))
	if want := `server.auth.tokens[1].secret_env: "SLUICE_TOKEN_OPS": environment variable SLUICE_TOKEN_OPS holds 5 bytes: a token must be at least 16 (32 random bytes recommended) (line 9)`; err == nil || err.Error() != want {
		t.Errorf("Tokens() with a short secret: error = %v, want %s", err, want)
	}
	env["SLUICE_TOKEN_OPS"] = "ops-token-0123456789"
	toks, err := got.Tokens(lookup(env))
	if err != nil || len(toks) != 2 || string(toks[1].Secret) != "ops-token-0123456789" || toks[1].Scopes[1] != "refund" {
		t.Errorf("Tokens() = %+v, %v; want both tokens with their secrets and scopes", toks, err)
	}
	if _, err := sluice.New(nopStore{}, got.SluicePolicies(), sluice.Options{}); err != nil {
		t.Errorf("sluice.New(full.yaml policies) = %v", err)
	}
}

func TestProxyDefaults(t *testing.T) {
	c, err := config.Parse(strings.NewReader(`
policies: [{ id: demo, algorithm: fixed_window, limit: 3, window: 10s }]
proxy:
  upstream: "http://127.0.0.1:9000"
  local_share: 1
  routes: [{ match: { path_prefix: / }, policies: [demo] }]
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Proxy.Listen != config.DefaultProxyListen || c.Proxy.LocalShare != 1 || c.Proxy.Routes[0].Subject != "ip" {
		t.Errorf("proxy = %+v, want listen %s, local_share 1 (an integer is a number), subject ip", c.Proxy, config.DefaultProxyListen)
	}
	c, err = config.Parse(strings.NewReader(`
server: { listen: "127.0.0.1:0" }
policies: [{ id: demo, algorithm: fixed_window, limit: 3, window: 10s }]
proxy:
  listen: "127.0.0.1:0"
  upstream: "http://127.0.0.1:9000"
  routes: [{ match: { path_prefix: / }, policies: [demo] }]
`))
	if err != nil {
		t.Fatalf("server and proxy both on port 0 (two free ports): %v", err)
	}
	if c.Proxy.LocalShare != config.DefaultLocalShare {
		t.Errorf("local_share = %v, want the default %v", c.Proxy.LocalShare, config.DefaultLocalShare)
	}
}

func TestMatchOperation(t *testing.T) {
	for _, tt := range []struct {
		m    config.Match
		want string
	}{
		{config.Match{PathPrefix: "/"}, "* /"},
		{config.Match{PathPrefix: "/api/"}, "* /api"},
		{config.Match{PathPrefix: "/a/../login", Methods: []string{"POST", "PUT"}}, "POST,PUT /login"},
	} {
		if got := tt.m.Operation(); got != tt.want {
			t.Errorf("%+v.Operation() = %q, want %q", tt.m, got, tt.want)
		}
	}
}

// TestRouteSubjectKind: each spelling of proxy.routes[].subject maps to
// one kind, a header subject with its name; the others to none.
func TestRouteSubjectKind(t *testing.T) {
	for _, tt := range []struct {
		subject, kind, header string
	}{
		{"ip", config.SubjectIP, ""},
		{"ip+user_agent", config.SubjectIPUserAgent, ""},
		{"header:X-Api-Key", config.SubjectHeader, "X-Api-Key"},
		{"header:", "", ""},
		{"header:X Api", "", ""},
		{"IP", "", ""},
		{"", "", ""},
	} {
		kind, header := config.Route{Subject: tt.subject}.SubjectKind()
		if kind != tt.kind || header != tt.header {
			t.Errorf("Route{Subject: %q}.SubjectKind() = %q, %q; want %q, %q", tt.subject, kind, header, tt.kind, tt.header)
		}
	}
}

func TestParseRedisURL(t *testing.T) {
	got, err := config.Load(filepath.Join("testdata", "valid", "redis_url.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := &config.Redis{URL: "rediss://sluice@redis.internal:6380/2", PasswordEnv: "REDIS_PASSWORD"}
	if diff := cmp.Diff(want, got.Store.Redis); diff != "" {
		t.Errorf("store.redis mismatch (-want +got):\n%s", diff)
	}
	env := map[string]string{"REDIS_PASSWORD": "s3cret"}
	if pw, err := got.Store.Redis.Password(lookup(env)); err != nil || pw != "s3cret" {
		t.Errorf("Password() = %q, %v; want s3cret, nil", pw, err)
	}
	_, err = got.Store.Redis.Password(lookup(nil))
	if want := `store.redis.password_env: "REDIS_PASSWORD": environment variable REDIS_PASSWORD is not set or empty`; err == nil || err.Error() != want {
		t.Errorf("Password() without the variable: error = %v, want %s", err, want)
	}
}

// TestParseRedisFiles: the ACL user and the password may come from
// files (read by wiring, again whenever they change).
func TestParseRedisFiles(t *testing.T) {
	got, err := config.Load(filepath.Join("testdata", "valid", "redis_files.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := &config.Redis{URL: "redis://redis.internal:6379/0", UsernameFile: "/run/secrets/redis/username", PasswordFile: "/run/secrets/redis/password"}
	if diff := cmp.Diff(want, got.Store.Redis); diff != "" {
		t.Errorf("store.redis mismatch (-want +got):\n%s", diff)
	}
}

// TestParseMemoryMaxKeys: store.memory.max_keys reaches the Config; left
// out, the section is nil (the bound is then derived, see wiring).
func TestParseMemoryMaxKeys(t *testing.T) {
	got, err := config.Load(filepath.Join("testdata", "valid", "memory_max_keys.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (&config.Memory{MaxKeys: 200_000}); !cmp.Equal(got.Store.Memory, want) {
		t.Errorf("store.memory = %+v, want %+v", got.Store.Memory, want)
	}
	if d := config.Default(); d.Store.Memory != nil {
		t.Errorf("Default().Store.Memory = %+v, want nil", d.Store.Memory)
	}
}

func TestValidateConfigBuiltInGo(t *testing.T) {
	c := config.Default()
	c.Policies[1].Window = 8761 * time.Hour
	err := c.Validate()
	want := `policies[1].window: 8761h0m0s: must be between 1ms and 365 days (8760h)`
	if err == nil || err.Error() != want {
		t.Fatalf("Validate() = %v, want %s", err, want)
	}
	c = config.Default()
	c.Policies = append(c.Policies, c.Policies[0])
	want = `policies[3].id: "demo": is already the id of policies[0]`
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Fatalf("Validate() = %v, want %s", err, want)
	}
}

func TestHMACKeys(t *testing.T) {
	c, err := config.Parse(strings.NewReader(`
policies: [{id: demo, algorithm: fixed_window, limit: 3, window: 10s}]
subjects:
  hmac_keys:
    - {id: k2, secret_env: SLUICE_HMAC_K2}
    - {id: k1, secret_env: SLUICE_HMAC_K1}
`))
	if err != nil {
		t.Fatal(err)
	}
	long, short := strings.Repeat("x", 32), "tooshort"
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"ok", map[string]string{"SLUICE_HMAC_K2": long, "SLUICE_HMAC_K1": long + "1"}, ""},
		{"missing", map[string]string{"SLUICE_HMAC_K2": long}, `subjects.hmac_keys[1].secret_env: "SLUICE_HMAC_K1": environment variable SLUICE_HMAC_K1 is not set or empty (line 6)`},
		{"short", map[string]string{"SLUICE_HMAC_K2": short, "SLUICE_HMAC_K1": long}, `subjects.hmac_keys[0].secret_env: "SLUICE_HMAC_K2": environment variable SLUICE_HMAC_K2 holds 8 bytes: an HMAC secret must be at least 16 (32 random bytes recommended) (line 5)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := c.HMACKeys(lookup(tc.env))
			if tc.want != "" {
				if err == nil || err.Error() != tc.want {
					t.Fatalf("HMACKeys() error = %v, want %s", err, tc.want)
				}
				if strings.Contains(err.Error(), short) {
					t.Errorf("HMACKeys() error %q reveals the secret", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != 2 || keys[0].ID != "k2" || string(keys[0].Secret) != long {
				t.Fatalf("HMACKeys() = %+v, want k2 then k1", keys)
			}
			if _, err := subject.New(keys); err != nil {
				t.Errorf("subject.New(HMACKeys()) = %v", err)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, dir := range []string{"invalid", "valid"} {
		files, err := filepath.Glob(filepath.Join("testdata", dir, "*.yaml"))
		if err != nil {
			f.Fatal(err)
		}
		for _, file := range files {
			b, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Add([]byte("a: &a [*a]\npolicies: *a\n"))
	f.Add([]byte("policies:\n  - &p {id: a, algorithm: gcra, limit: 1, window: 1s}\n  - *p\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := config.Parse(bytes.NewReader(data))
		if err != nil {
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("Parse error %v is %T, want *config.Error", err, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate rejects: %v", err)
		}
		if len(c.Policies) == 0 {
			return // an envoy-only config: the rules files hold the policies
		}
		if _, err := sluice.New(nopStore{}, c.SluicePolicies(), sluice.Options{}); err != nil {
			t.Fatalf("Parse accepted policies sluice.New rejects: %v", err)
		}
	})
}

type nopStore struct{}

func (nopStore) Evaluate(ctx context.Context, ev *sluice.Evaluation) error { return nil }

func lookup(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

func TestParseTelemetry(t *testing.T) {
	got, err := config.Load(filepath.Join("testdata", "valid", "telemetry.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := &config.Telemetry{Endpoint: "http://collector:4318", Protocol: config.ProtocolHTTP, SamplingRatio: 0.25, ServiceName: "edge-limiter"}
	if diff := cmp.Diff(want, got.Telemetry); diff != "" {
		t.Errorf("telemetry mismatch (-want +got):\n%s", diff)
	}
	c, err := config.Parse(strings.NewReader("telemetry: { endpoint: \"https://otel.internal:4317\" }\npolicies: [{ id: a, algorithm: gcra, limit: 1, window: 1s }]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want = &config.Telemetry{Endpoint: "https://otel.internal:4317", Protocol: config.ProtocolGRPC, SamplingRatio: 1, ServiceName: config.DefaultServiceName}
	if diff := cmp.Diff(want, c.Telemetry); diff != "" {
		t.Errorf("telemetry defaults mismatch (-want +got):\n%s", diff)
	}
}
