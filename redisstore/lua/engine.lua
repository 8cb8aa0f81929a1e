--[[ engine.lua ports internal/algorithm/engine.go: one evaluation, all or
nothing, with the clock rule and the unspent-peek answers. A policy is a
table {kind, params = {limit, window, burst}}; a state {v = fields} for
the fixed-size algorithms, {log = view} for the sliding log; a write
{v, log, fresh, expires}; an evaluation
{policies, states, now, cost, refund, reset, maxRegression, replay} that
evaluate fills with decisions, writes, commit and replayed. Errors are
returned as tables {clock = {policy, behind, max}} or
{replay = {first, now}}, as the Go code returns *ClockError and
*ReplayError. ]]

-- The integers each fixed-size algorithm keeps: algorithm.Fields.
local FIELDS = {
  [KIND_FIXED_WINDOW] = 3,
  [KIND_SLIDING_LOG] = 0,
  [KIND_SLIDING_WINDOW] = 4,
  [KIND_TOKEN_BUCKET] = 3,
  [KIND_GCRA] = 5,
}

-- ABSENT is the state of a policy that has none: absent.
local ABSENT = {v = {0, 0, 0, 0, 0}, log = {len = 0, newest = 0}}

-- recordID ports RecordID.
local function recordID(id, cost, refund)
  if id == '' or cost == 0 then
    return ''
  elseif refund then
    return 'r:' .. id
  end
  return 's:' .. id
end

-- bounds ports Policy.bounds.
local function bounds(p, st)
  local k = p.kind
  if k == KIND_FIXED_WINDOW then
    local s = fixedWindowOf(st.v)
    return fixedWindowExpires(s, p.params), fixedWindowNewest(s)
  elseif k == KIND_SLIDING_LOG then
    local s = st.log
    return slidingLogExpires(s, p.params), slidingLogNewest(s)
  elseif k == KIND_SLIDING_WINDOW then
    local s = slidingWindowOf(st.v)
    return slidingWindowExpires(s, p.params), slidingWindowNewest(s)
  elseif k == KIND_TOKEN_BUCKET then
    local s = tokenBucketOf(st.v)
    return tokenBucketExpires(s, p.params), tokenBucketNewest(s)
  elseif k == KIND_GCRA then
    local s = gcraOf(st.v)
    return gcraExpires(s, p.params), gcraNewest(s)
  end
  return 0, 0
end

-- step ports Policy.step.
local function step(p, st, now, cost, refund, w)
  local d
  local k, prm = p.kind, p.params
  if k == KIND_FIXED_WINDOW then
    local s = fixedWindowOf(st.v)
    if refund then
      s, d = fixedWindowRefund(s, prm, now, cost)
    else
      s, d = fixedWindowDecide(s, prm, now, cost)
    end
    w.v, w.expires = fixedWindowFields(s), fixedWindowExpires(s, prm)
  elseif k == KIND_SLIDING_LOG then
    local s = st.log
    if refund then
      w.log, d = slidingLogRefund(s, prm, now, cost)
    else
      w.log, d = slidingLogDecide(s, prm, now, cost)
    end
    w.expires = 0
    if w.log.newest ~= 0 then
      w.expires = w.log.newest + prm.window
    end
  elseif k == KIND_SLIDING_WINDOW then
    -- No Refund: a store never asks (sluice.Limiter refuses it first).
    local s = slidingWindowOf(st.v)
    s, d = slidingWindowDecide(s, prm, now, cost)
    w.v, w.expires = slidingWindowFields(s), slidingWindowExpires(s, prm)
  elseif k == KIND_TOKEN_BUCKET then
    local s = tokenBucketOf(st.v)
    if refund then
      s, d = tokenBucketRefund(s, prm, now, cost)
    else
      s, d = tokenBucketDecide(s, prm, now, cost)
    end
    w.v, w.expires = tokenBucketFields(s), tokenBucketExpires(s, prm)
  elseif k == KIND_GCRA then
    local s = gcraOf(st.v)
    if refund then
      s, d = gcraRefund(s, prm, now, cost)
    else
      s, d = gcraDecide(s, prm, now, cost)
    end
    w.v, w.expires = gcraFields(s), gcraExpires(s, prm)
  end
  return d
end

-- current ports current.
local function current(p, st, now, maxRegression)
  if st == nil then
    return ABSENT, now, nil
  end
  local exp, nw = bounds(p, st)
  if exp <= now then
    return ABSENT, now, nil
  end
  local at = now
  if nw > now then
    if maxRegression >= 0 and nw - now > maxRegression then
      return nil, 0, {behind = nw - now, max = maxRegression}
    end
    at = nw
  end
  if exp <= at then
    return ABSENT, at, nil
  end
  return st, at, nil
end

-- lengthen ports lengthen.
local function lengthen(d, lag)
  if d.retryAfter > 0 then
    d.retryAfter = d.retryAfter + lag
  end
  if d.resetAfter > 0 then
    d.resetAfter = d.resetAfter + lag
  end
  return d
end

-- evaluate ports Evaluate.
local function evaluate(ev)
  local n = #ev.policies
  ev.decisions, ev.writes = {}, {}
  ev.commit, ev.replayed = false, false
  if ev.reset then
    for i, p in ipairs(ev.policies) do
      ev.writes[i] = {}
      ev.decisions[i] = step(p, ABSENT, ev.now, 0, false, ev.writes[i])
      ev.writes[i].fresh = true
    end
    ev.commit = true
    return nil
  end
  if ev.replay ~= nil then
    if #ev.replay ~= n then
      return {replay = {first = #ev.replay, now = n}}
    end
    ev.decisions = ev.replay
    ev.replayed = true
    return nil
  end
  local admitted = true
  for i, p in ipairs(ev.policies) do
    local st, at, err = current(p, ev.states[i], ev.now, ev.maxRegression)
    if err ~= nil then
      err.policy = i - 1
      return {clock = err}
    end
    local w = {}
    local d = step(p, st, at, ev.cost, ev.refund, w)
    w.fresh = st ~= ev.states[i]
    if at ~= ev.now then
      d = lengthen(d, at - ev.now)
    end
    ev.decisions[i], ev.writes[i] = d, w
    admitted = admitted and d.allowed
  end
  if not admitted and n > 1 then
    for i, p in ipairs(ev.policies) do
      if ev.decisions[i].allowed then
        local st, at = current(p, ev.states[i], ev.now, ev.maxRegression)
        local d = step(p, st, at, 0, false, {})
        ev.decisions[i] = lengthen(d, at - ev.now)
      end
    end
  end
  ev.commit = admitted and ev.cost > 0
  return nil
end
