--[[ engine.lua ports internal/engine/algorithm/engine.go: one evaluation, all or
nothing, with the clock rule and the unspent-peek answers.

A policy is a table {kind, limit, window, burst}: Policy with its Params
inline, so the algorithms read p.limit as Go reads p.Params.Limit. A state
is the array of a fixed-size algorithm's fields (State.V), or for the
sliding log a view {key, len, newest} (State.Log), or for concurrency a
view {key, len, newest} of its leases (State.Log and State.IDs); nil is
absent. A write is {v, log, leases, fresh, expires}. Decisions are flat,
DECISION_SIZE integers per policy from offset 1 + DECISION_SIZE × (i − 1):
allowed (1 or 0), limit, remaining, resetAfter, retryAfter; the first
integer is the store's (its reply's replayed flag, 0 here), so the
decisions are the reply as they stand. An evaluation
is {policies, states, now, op, cost, hold, lease, maxRegression, replay} that
evaluate fills with decisions, writes, commit and replayed; op is the
Go Op's name (spend, peek, refund, reset, acquire, release, renew,
estimate: a spend here; a settle goes to settle.lua's evaluateSettle;
a book to evaluateBook, its decision followed by its delay) and
lease the lease of a concurrency policy ('' for none). evaluate assumes
the operation's rules hold: redisstore.go checks them with
algorithm.Check before it calls. Errors are returned as tables
{clock = {policy, behind, max}} or {replay = {first, now}}, as the Go code
returns *ClockError and *ReplayError. ]]

-- The integers each fixed-size algorithm keeps: algorithm.Fields.
local FIELDS = {
  [KIND_FIXED_WINDOW] = 3,
  [KIND_SLIDING_LOG] = 0,
  [KIND_SLIDING_WINDOW] = 4,
  [KIND_TOKEN_BUCKET] = 3,
  [KIND_GCRA] = 5,
  [KIND_CONCURRENCY] = 0,
  [KIND_FIXED_WINDOW_END] = 2,
  [KIND_FIXED_PERIOD] = 3,
}

-- The integers of one decision: algorithm.Decision's fields.
local DECISION_SIZE = 5

-- The states of a policy that has none: absent.
local ABSENT_V = {0, 0, 0, 0, 0}
local ABSENT_LOG = {len = 0, newest = 0}
local ABSENT_LEASES = {len = 0, newest = 0}

-- absentOf returns the absent state of kind k.
local function absentOf(k)
  if k == KIND_SLIDING_LOG then
    return ABSENT_LOG
  elseif k == KIND_CONCURRENCY then
    return ABSENT_LEASES
  end
  return ABSENT_V
end

-- recordID ports RecordID.
local function recordID(id, op)
  if id == '' then
    return ''
  elseif op == 'spend' or op == 'acquire' then
    return 's:' .. id
  elseif op == 'refund' then
    return 'r:' .. id
  elseif op == 'estimate' then
    return 'e:' .. id
  elseif op == 'settle' then
    return 't:' .. id
  end
  return ''
end

-- recordCorrupt ports RecordCorrupt on decisions as the reply holds them
-- (flat, the replayed flag first), with the check Go's bool makes for it:
-- allowed is 1 or 0.
local function recordCorrupt(ds)
  for o = 2, #ds, DECISION_SIZE do
    local i = (o - 2) / DECISION_SIZE
    local allowed, limit, remaining, resetAfter, retryAfter = ds[o], ds[o + 1], ds[o + 2], ds[o + 3], ds[o + 4]
    if allowed ~= 0 and allowed ~= 1 then
      return 'decision ' .. i .. ': allowed ' .. fmt(allowed) .. ': want 1 or 0'
    elseif limit < 1 or limit > MAX_LIMIT or remaining < 0 or remaining > limit then
      return 'decision ' .. i .. ': limit ' .. fmt(limit) .. ', remaining ' .. fmt(remaining) .. ': want 0 <= remaining <= limit, limit 1 to ' .. fmt(MAX_LIMIT)
    elseif resetAfter < 0 or resetAfter >= MAX_EXACT or retryAfter < 0 or retryAfter >= MAX_EXACT then
      return 'decision ' .. i .. ': reset after ' .. fmt(resetAfter) .. ', retry after ' .. fmt(retryAfter) .. ' µs: want each in [0, 2^53)'
    elseif (allowed == 1) ~= (retryAfter == 0) then
      return 'decision ' .. i .. ': allowed ' .. fmt(allowed) .. ' with retry after ' .. fmt(retryAfter) .. ' µs: want 0 exactly when allowed'
    end
  end
  return nil
end

-- boundsFixed ports Policy.bounds for a fixed-size kind k, its state's
-- fields a to e as values.
local function boundsFixed(k, p, a, b, c, d, e)
  if k == KIND_GCRA then
    return gcraExpires(a, b, c, d, e, p), gcraNewest(e)
  elseif k == KIND_FIXED_WINDOW then
    return fixedWindowExpires(a, b, p), fixedWindowNewest(c)
  elseif k == KIND_FIXED_WINDOW_END then
    return fixedWindowEndExpires(a, b), fixedWindowEndNewest()
  elseif k == KIND_FIXED_PERIOD then
    return fixedPeriodExpires(a, b), fixedPeriodNewest(c)
  elseif k == KIND_TOKEN_BUCKET then
    return tokenBucketExpires(a, b, c, p), tokenBucketNewest(b)
  elseif k == KIND_SLIDING_WINDOW then
    return slidingWindowExpires(a, b, c, p), slidingWindowNewest(d)
  end
  return 0, 0
end

-- bounds ports Policy.bounds.
local function bounds(p, st)
  local k = p.kind
  if k == KIND_SLIDING_LOG then
    return slidingLogExpires(st, p), slidingLogNewest(st)
  elseif k == KIND_CONCURRENCY then
    if concurrencyNewest(st) == 0 then
      return 0, 0
    end
    return concurrencyExpires(st), concurrencyNewest(st) - p.window
  end
  return boundsFixed(k, p, st[1], st[2], st[3], st[4], st[5])
end

-- stepPeriod ports stepPeriod, on values: decideFixed's answer for a
-- calendar period's fields a to c.
local function stepPeriod(p, a, b, c, now, cost, refund)
  local allowed, remaining, resetAfter, retryAfter
  if refund then
    a, b, c, allowed, remaining, resetAfter, retryAfter = fixedPeriodRefund(a, b, c, p, now, cost)
  else
    a, b, c, allowed, remaining, resetAfter, retryAfter = fixedPeriodDecide(a, b, c, p, now, cost)
  end
  return a, b, c, 0, 0, allowed, remaining, resetAfter, retryAfter, fixedPeriodExpires(a, b), p.limit
end

-- decideFixed ports the part of Policy.step a fixed-size kind k takes,
-- on values: its state's fields a to e, decided at now with cost (a
-- refund when refund is true) held for hold µs (0: not held), return the
-- fields after it, the decision's allowed, remaining, resetAfter and
-- retryAfter, the state's expiry and the decision's limit.
local function decideFixed(k, p, a, b, c, d, e, now, cost, refund, hold)
  local allowed, remaining, resetAfter, retryAfter
  if k == KIND_GCRA then
    if refund then
      a, b, c, d, e, allowed, remaining, resetAfter, retryAfter = gcraRefund(a, b, c, d, e, p, now, cost)
    else
      a, b, c, d, e, allowed, remaining, resetAfter, retryAfter = gcraDecide(a, b, c, d, e, p, now, cost, hold)
    end
    return a, b, c, d, e, allowed, remaining, resetAfter, retryAfter, gcraExpires(a, b, c, d, e, p), p.burst
  elseif k == KIND_FIXED_WINDOW then
    if refund then
      a, b, c, allowed, remaining, resetAfter, retryAfter = fixedWindowRefund(a, b, c, p, now, cost)
    else
      a, b, c, allowed, remaining, resetAfter, retryAfter = fixedWindowDecide(a, b, c, p, now, cost)
    end
    return a, b, c, 0, 0, allowed, remaining, resetAfter, retryAfter, fixedWindowExpires(a, b, p), p.limit
  elseif k == KIND_FIXED_WINDOW_END then
    if refund then
      a, b, allowed, remaining, resetAfter, retryAfter = fixedWindowEndRefund(a, b, p, now, cost)
    else
      a, b, allowed, remaining, resetAfter, retryAfter = fixedWindowEndDecide(a, b, p, now, cost)
    end
    return a, b, 0, 0, 0, allowed, remaining, resetAfter, retryAfter, fixedWindowEndExpires(a, b), p.limit
  elseif k == KIND_FIXED_PERIOD then
    return stepPeriod(p, a, b, c, now, cost, refund)
  elseif k == KIND_TOKEN_BUCKET then
    if refund then
      a, b, c, allowed, remaining, resetAfter, retryAfter = tokenBucketRefund(a, b, c, p, now, cost)
    else
      a, b, c, allowed, remaining, resetAfter, retryAfter = tokenBucketDecide(a, b, c, p, now, cost, hold)
    end
    return a, b, c, 0, 0, allowed, remaining, resetAfter, retryAfter, tokenBucketExpires(a, b, c, p), p.burst
  end
  -- KIND_SLIDING_WINDOW. No Refund: a store never asks (algorithm.Check
  -- refuses it first).
  a, b, c, d, allowed, remaining, resetAfter, retryAfter = slidingWindowDecide(a, b, c, d, p, now, cost)
  return a, b, c, d, 0, allowed, remaining, resetAfter, retryAfter, slidingWindowExpires(a, b, c, p), p.limit
end

-- step ports Policy.step: it puts the decision in ds at offset o and
-- returns the write. op is the operation's name, cost, hold and lease as
-- the Go code's. The decision's integers go into ds in order and the write is
-- built in one constructor: a Lua table that grows key by key is rebuilt
-- at each step of its growth.
local function step(p, st, now, op, cost, hold, lease, ds, o)
  local k = p.kind
  local v, log, leases, expires, limit = nil, nil, nil, 0, p.limit
  local allowed, remaining, resetAfter, retryAfter, delay
  local refund = op == 'refund'
  if k == KIND_CONCURRENCY then
    if op == 'release' then
      leases, allowed, remaining, resetAfter, retryAfter = concurrencyRelease(st, p, now, lease)
    elseif op == 'renew' then
      leases, allowed, remaining, resetAfter, retryAfter = concurrencyRenew(st, p, now, lease)
    elseif op == 'acquire' then
      leases, allowed, remaining, resetAfter, retryAfter = concurrencyDecide(st, p, now, 1, lease)
    else -- a peek
      leases, allowed, remaining, resetAfter, retryAfter = concurrencyDecide(st, p, now, 0, '')
    end
    expires = leases.newest
  elseif k == KIND_SLIDING_LOG then
    if refund then
      log, allowed, remaining, resetAfter, retryAfter = slidingLogRefund(st, p, now, cost)
    else
      log, allowed, remaining, resetAfter, retryAfter = slidingLogDecide(st, p, now, cost)
    end
    if log.newest ~= 0 then
      expires = log.newest + p.window
    end
  elseif op == 'book' then -- gcra or token_bucket: Check refuses every other kind
    local a, b, c, d, e = st[1], st[2], st[3], st[4], st[5]
    if k == KIND_GCRA then
      a, b, c, d, e, allowed, remaining, resetAfter, retryAfter, delay = gcraBook(a, b, c, d, e, p, now, cost, hold)
      expires = gcraExpires(a, b, c, d, e, p)
    else
      a, b, c, allowed, remaining, resetAfter, retryAfter, delay = tokenBucketBook(a, b, c, p, now, cost, hold)
      d, e, expires = 0, 0, tokenBucketExpires(a, b, c, p)
    end
    v, limit = {a, b, c, d, e}, p.burst
  else
    local a, b, c, d, e
    a, b, c, d, e, allowed, remaining, resetAfter, retryAfter, expires, limit =
      decideFixed(k, p, st[1], st[2], st[3], st[4], st[5], now, cost, refund, hold)
    v = {a, b, c, d, e}
  end
  ds[o + 1] = allowed and 1 or 0
  ds[o + 2] = limit
  ds[o + 3] = remaining
  ds[o + 4] = resetAfter
  ds[o + 5] = retryAfter
  if delay ~= nil then
    ds[o + 6] = delay -- a booking's, after its decision (Decision.Delay): the reply's one extra integer
  end
  return {v = v, log = log, leases = leases, expires = expires, fresh = false}
end

-- when ports the part of currentAt that reads a state's bounds, exp and
-- nw: whether the state is live at the time it is decided at (else it is
-- decided as absent), that time, and when the caller's clock lies too far
-- behind, false, 0 and by how much.
local function when(exp, nw, now, maxRegression)
  if exp <= now then
    return false, now
  end
  local at = now
  if nw > now then
    if maxRegression >= 0 and nw - now > maxRegression then
      return false, 0, nw - now
    end
    at = nw
  end
  return exp > at, at
end

-- currentAt ports currentAt.
local function currentAt(p, st, now, maxRegression)
  if st == nil then
    return absentOf(p.kind), now
  end
  local exp, nw = bounds(p, st)
  local live, at, behind = when(exp, nw, now, maxRegression)
  if behind ~= nil then
    return nil, 0, behind
  elseif not live then
    return absentOf(p.kind), at
  end
  return st, at
end

-- current ports current: the state, the time it is decided at, and when
-- the caller's clock lies too far behind, nil, 0 and by how much; a
-- calendar period's policy decided at a time outside its periods raises
-- SLUICE_CLOCK (fixedPeriodOutside), as Go's returns a *ClockError. key
-- names the state in that error.
local function current(p, st, now, maxRegression, key)
  local cur, at, behind = currentAt(p, st, now, maxRegression)
  if behind == nil and p.kind == KIND_FIXED_PERIOD then
    fixedPeriodOutside(key or '', p, at)
  end
  return cur, at, behind
end

-- lengthenBy ports lengthen on a decision's resetAfter and retryAfter.
local function lengthenBy(resetAfter, retryAfter, lag)
  if retryAfter > 0 then
    retryAfter = retryAfter + lag
  end
  if resetAfter > 0 then
    resetAfter = resetAfter + lag
  end
  return resetAfter, retryAfter
end

-- lengthen ports lengthen, on the decision at offset o of ds.
local function lengthen(ds, o, lag)
  ds[o + 4], ds[o + 5] = lengthenBy(ds[o + 4], ds[o + 5], lag)
end

-- evaluateBook ports evaluateBook: the one policy of a booking (ev.hold
-- its most wait) booked on its state; the delay follows its decision in
-- ev.decisions.
local function evaluateBook(ev)
  local p, now, maxRegression = ev.policies[1], ev.now, ev.maxRegression
  local ds = {0}
  ev.decisions, ev.commit, ev.replayed = ds, false, false
  local st, at, behind = current(p, ev.states[1], now, maxRegression, 'policy 0')
  if st == nil then
    return {clock = {policy = 0, behind = behind, max = maxRegression}}
  end
  local lag = at - now
  local w = step(p, st, at, 'book', ev.cost, ev.hold - lag, '', ds, 1)
  w.fresh = st ~= ev.states[1]
  if lag ~= 0 then
    lengthen(ds, 1, lag)
    if ds[7] > 0 then
      ds[7] = ds[7] + lag
    end
  end
  ev.writes = {w}
  ev.commit = ds[2] == 1
  return nil
end

-- evaluate ports Evaluate.
local function evaluate(ev)
  if ev.op == 'book' then
    return evaluateBook(ev)
  end
  local policies, states = ev.policies, ev.states
  local n, now = #policies, ev.now
  local ds, ws = {0}, {}
  ev.decisions, ev.writes = ds, ws
  ev.commit, ev.replayed = false, false
  local op = ev.op
  if op == 'reset' then
    for i = 1, n do
      local p = policies[i]
      ws[i] = step(p, absentOf(p.kind), now, 'peek', 0, 0, '', ds, 1 + DECISION_SIZE * (i - 1))
      ws[i].fresh = true
    end
    ev.commit = true
    return nil
  end
  if ev.replay ~= nil then
    if #ev.replay ~= 1 + DECISION_SIZE * n then
      return {replay = {first = (#ev.replay - 1) / DECISION_SIZE, now = n}}
    end
    ev.decisions = ev.replay
    ev.replayed = true
    return nil
  end
  local admitted, cost, hold, lease, maxRegression = true, ev.cost, ev.hold, ev.lease, ev.maxRegression
  for i = 1, n do
    local p = policies[i]
    local st, at, behind = current(p, states[i], now, maxRegression, 'policy ' .. (i - 1))
    if st == nil then
      return {clock = {policy = i - 1, behind = behind, max = maxRegression}}
    end
    local o = 1 + DECISION_SIZE * (i - 1)
    local w = step(p, st, at, op, cost, hold, lease, ds, o)
    w.fresh = st ~= states[i]
    if at ~= now then
      lengthen(ds, o, at - now)
    end
    ws[i] = w
    admitted = admitted and ds[o + 1] == 1
  end
  if not admitted and n > 1 then
    for i = 1, n do
      local p, o = policies[i], 1 + DECISION_SIZE * (i - 1)
      if ds[o + 1] == 1 then
        local st, at = current(p, states[i], now, maxRegression, 'policy ' .. (i - 1))
        step(p, st, at, 'peek', 0, 0, '', ds, o)
        lengthen(ds, o, at - now)
      end
    end
  end
  ev.commit = admitted and op ~= 'peek'
  return nil
end
