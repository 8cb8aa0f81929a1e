// Package rls is Envoy's rate-limit service (RLS v3,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over a
// sluice Limiter, with rules read by package rules, and the standard
// gRPC health service.
//
// A request names a domain and descriptors. Each descriptor is matched to
// at most one rule (rules.Config.Match); a rule named in another
// matched rule's replaces is dropped. The cost is the descriptor's
// hits_addend when it has one, else the request's, where 0 or absent
// means 1; a descriptor's hits_addend of 0 checks without spending (a
// peek: OVER_LIMIT when the next unit would be denied). The subject
// of a descriptor is the pseudonym of its domain and of the entries its
// rule does not fix (the values matched by a key alone or a wildcard
// without share_threshold), so no raw descriptor value reaches a store,
// a log line or a metric.
//
// A descriptor's limit (RateLimitDescriptor.limit) in a known domain
// replaces the rule that matches it, or applies where none does, as in
// envoyproxy/ratelimit: its numbers (requests_per_unit per unit ×
// unit_multiplier, at most 24h) are a fixed window aligned to the clock
// whose policy ID is derived from them, so each set of numbers counts on
// a counter of its own; every entry of the descriptor names the budget.
// An override is never shadow, unlimited or replaced. On an in-flight
// rule a descriptor's limit is ignored: the in-flight rule decides (a
// count per unit keyed by every entry, the request id among them, would
// give each stream a budget of its own), counted in
// sluice_envoy_ignored_limit_total{rule} and logged (throttled), never
// refused: Envoy's failure_mode_deny: false admits what an error answers.
//
// Descriptors of one request with the same subject and cost are decided
// in one Limiter.Check over their policies, all or nothing: when one is
// over its limit nothing is spent on the others. The engine decides one
// cost per evaluation, so descriptors of one subject asking for
// different costs (or one with a limit override) are decided one check
// each: those that spend nothing first, then in request order, and once
// one of the subject's is denied the rest of that subject only check.
// Descriptors with different subjects are decided separately, as
// envoyproxy/ratelimit decides every descriptor. A descriptor repeated in
// one request (same rule, subject and cost) is counted once and answered
// alike.
//
// Each descriptor gets a status: OK or OVER_LIMIT with current_limit,
// limit_remaining and duration_until_reset; OK without current_limit
// when no rule matches (an unknown domain or descriptor, as
// envoyproxy/ratelimit answers); OK with limit_remaining 4294967295 for
// unlimited rules; OK, whatever the verdict, for shadow_mode rules. The
// overall code is OVER_LIMIT when any status of a rule outside quota_mode
// is, or when every quota_mode descriptor's is (envoyproxy/ratelimit's
// quota_mode); with State.ResponseMetadata the answer carries their
// dynamic metadata (see dynamicMetadata). The answer carries the
// RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers for every rule the store decided,
// shadow_mode ones included (a shadow answer carries what an enforced
// one would), and Retry-After when an enforced rule is over the limit,
// as response_headers_to_add.
//
// When the store cannot decide (an Unavailable or Indeterminate outcome,
// or corrupt state), the policies' failure mode picks the answer: if
// every policy of the descriptors concerned is open, they are answered OK
// (without limit_remaining); otherwise the call fails with gRPC status
// UNAVAILABLE, so Envoy's rate_limit filter applies its own
// failure_mode_deny (deny when true, allow when false). The response code
// UNKNOWN is never sent: Envoy treats it as OK.
//
// In-flight limits (a rule's sluice_in_flight, rules.Rule.InFlight)
// are leases: the request-time call acquires one, named by the pseudonym
// of the descriptor's last value (Envoy's x-request-id), for the subject
// of the entries above it; Envoy's stream-done call (apply_on_stream_done)
// sends the same descriptor with is_negative_hits or a hits_addend of 0,
// and releases it; a lease whose release never comes expires after the
// policy's lease TTL. Each such descriptor is decided in a check of its
// own.
//
// Costs settled on stream done (a rule's sluice_settle,
// rules.Rule.Settles): the request-time call spends an estimate, the
// stream-done call settles it at the actual cost; match.go says how the
// two calls find each other. A settle is never denied, whatever its
// cost: the store charges it up to its debt bound.
//
// Priority classes (a rule's sluice_priorities): a descriptor names its
// class in an entry of key rules.PriorityKey, removed before
// matching; match.go (classOf) says how it is decided.
//
// A spend above what a descriptor's class may ever spend (its rule's, or
// a tenant plan's lower limit) is OVER_LIMIT, never an error: Envoy's
// failure_mode_deny: false admits what an error answers. The store
// refuses it before it reads any state (algorithm.ErrCostTooHigh), as it
// refuses any edge's: the check it is decided in is denied whole, every
// descriptor of it OVER_LIMIT, and the subject's later checks only peek,
// as after any denial.
//
// A decision is one path, a phase a file: ShouldRateLimit (rls.go) takes
// the request's memory from a pool, matches its descriptors to rules and
// reads sluice's own entries (match.go), asks the edge core once per
// group of descriptors (rls.go), and builds and counts the answer
// (answer.go).
package rls
