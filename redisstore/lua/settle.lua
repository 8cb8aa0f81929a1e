--[[ settle.lua ports internal/engine/algorithm/settle.go: an estimate spent
as a spend and remembered, then settled with the actual cost (the Go
file's comment says what each algorithm does with the difference). The
records of estimates and settles are kept in the id keys as dedupe.lua
keeps any other (a sorted set of expiries and a hash), the hash's value
holding after the decisions '|' and the record's Extra
(algorithm.Record): an estimate's cost and the time it was spent at, a
settle's charged, given back and owed of each policy. The functions on
a state return it, then the decision's allowed, remaining, resetAfter
and retryAfter, then charged, given back and owed. ]]

-- The refusal of a settle naming other policies than its estimate's
-- (errOtherPolicies).
local OTHER_POLICIES = "the estimate under this evaluation id was spent on other policies: a settle names exactly its estimate's policies, in the same order"

-- others ports Others: the names of the states keys[2..n] key (a key
-- without its prefix and subject: the part after the hash tag's '}',
-- policy id, revision and algorithm code), joined by ','; '' for one
-- policy.
local function others(keys, n)
  if n < 2 then
    return ''
  end
  local names = {}
  for i = 2, n do
    names[i - 1] = string.match(keys[i], '^.*}(.*)$')
  end
  return table.concat(names, ',')
end

-- estimateExtra ports EstimateExtra.
local function estimateExtra(cost, now)
  return {cost, now}
end

-- settledMost ports settledMost.
local function settledMost(c, most)
  return mathMin(2 * c, most)
end

-- settleCount ports settleCount: charged, given back, touched.
local function settleCount(count, delta, back, most)
  if delta < 0 and back then
    return 0, mathMin(-delta, count), true
  elseif delta > 0 then
    return mathMin(delta, mathMax(most - count, 0)), 0, true
  end
  return 0, 0, false
end

-- fixedWindowSettle ports FixedWindow.Settle.
local function fixedWindowSettle(start, count, last, p, now, spentAt, delta)
  start, count, last = fixedWindowDecide(start, count, last, p, now, 0) -- the window open at now
  local charged, given, touched = settleCount(count, delta, start <= spentAt, settledMost(p.limit, MAX_LIMIT))
  if touched then
    count, last = count + charged - given, now
  end
  if fixedWindowExpires(start, count, p) <= now then
    start, count, last = 0, 0, 0 -- nothing left to remember: absent, as a store drops it
  end
  local _, _, _, _, remaining, resetAfter = fixedWindowDecide(start, count, last, p, now, 0)
  return start, count, last, true, remaining, resetAfter, 0, charged, given, mathMax(count - p.limit, 0)
end

-- fixedWindowEndSettle ports FixedWindowEnd.Settle.
local function fixedWindowEndSettle(ends, count, p, now, spentAt, delta)
  ends, count = fixedWindowEndDecide(ends, count, p, now, 0)
  local charged, given = settleCount(count, delta, ends - p.window <= spentAt, settledMost(p.limit, MAX_LIMIT))
  count = count + charged - given
  if fixedWindowEndExpires(ends, count) <= now then
    ends, count = 0, 0
  end
  local _, _, _, remaining, resetAfter = fixedWindowEndDecide(ends, count, p, now, 0)
  return ends, count, true, remaining, resetAfter, 0, charged, given, mathMax(count - p.limit, 0)
end

-- fixedPeriodSettle ports FixedPeriod.Settle.
local function fixedPeriodSettle(ends, count, last, p, now, spentAt, delta)
  ends, count, last = fixedPeriodDecide(ends, count, last, p, now, 0) -- the period open at now
  local charged, given, touched = settleCount(count, delta, fixedPeriodEnd(p, spentAt) == ends, settledMost(p.limit, MAX_LIMIT))
  if touched then
    count, last = count + charged - given, now
  end
  if fixedPeriodExpires(ends, count) <= now then
    ends, count, last = 0, 0, 0 -- nothing left to remember: absent, as a store drops it
  end
  local _, _, _, _, remaining, resetAfter = fixedPeriodDecide(ends, count, last, p, now, 0)
  return ends, count, last, true, remaining, resetAfter, 0, charged, given, mathMax(count - p.limit, 0)
end

-- slidingLogSettle ports SlidingLog.Settle: the edit, then the decision
-- and what it did.
local function slidingLogSettle(s, p, now, spentAt, delta)
  local cut = slidingLogCut(s, p, now)
  local count = s.len - cut
  local charged, given = settleCount(count, delta, count > 0 and slidingLogNewest(s) == spentAt, settledMost(p.limit, MAX_SLIDING_LOG_LEN))
  local e = {cut = cut, drop = given, add = 0, at = 0, newest = 0}
  local left = count - e.drop
  if left > 0 then
    e.newest = slidingLogLive(s, cut + left - 1, p, now)
  end
  if charged > 0 then
    e.add, e.at, e.newest = charged, now, now
    left = left + charged
  end
  local resetAfter = 0
  if e.newest ~= 0 then
    resetAfter = e.newest + p.window - now
  end
  return e, true, mathMax(p.limit - left, 0), resetAfter, 0, charged, given, mathMax(left - p.limit, 0)
end

-- tokenBucketSettle ports TokenBucket.Settle.
local function tokenBucketSettle(tokens, last, window, p, now, delta)
  local charged, given = 0, 0
  local full = p.burst * p.window
  local level = tokenBucketLevel(tokens, last, window, p, now)
  if delta < 0 then
    -- Compared in units first: -delta × window may pass 2^53.
    given = ceilDiv(full - level, p.window)
    if -delta < given then
      given, level = -delta, level - delta * p.window
    else
      level = full
    end
  elseif delta > 0 then
    charged = mathMin(delta, mathMax(floorDiv(level - full, p.window) + settledMost(p.burst, MAX_LIMIT), 0))
    level = level - charged * p.window
  end
  tokens, last, window = level, now, p.window
  if tokenBucketExpires(tokens, last, window, p) <= now then
    tokens, last, window = 0, 0, 0 -- full: absent, as a store drops it
  end
  local _, _, _, _, remaining, resetAfter = tokenBucketDecide(tokens, last, window, p, now, 0, 0)
  return tokens, last, window, true, remaining, resetAfter, 0, charged, given, ceilDiv(mathMax(-level, 0), p.window)
end

-- gcraSettle ports GCRA.Settle.
local function gcraSettle(tat, frac, sLimit, sWindow, last, p, now, delta)
  local charged, given = 0, 0
  if not gcraScheduledUnder(tat, sLimit, sWindow, p) then
    tat, frac, sLimit, sWindow, last = gcraReschedule(tat, frac, sLimit, sWindow, last, p)
  end
  local limit, window = p.limit, p.window
  local tau = p.burst * window
  local debt = 0 -- (TAT − now) scaled by Limit, or 0 when the TAT is past
  local ahead = tat - now
  if tat ~= 0 and ahead >= 0 then
    debt = ahead * limit + frac
  end
  if delta < 0 then
    -- Compared in units first: -delta × window may pass 2^53.
    given = ceilDiv(debt, window)
    if -delta < given then
      given, debt = -delta, debt + delta * window
    else
      debt = 0
    end
  elseif delta > 0 then
    charged = mathMin(delta, mathMax(settledMost(p.burst, MAX_LIMIT) - ceilDiv(debt, window), 0))
    debt = debt + charged * window
  end
  tat, frac, sLimit, sWindow, last = now + quo(debt, limit), rem(debt, limit), limit, window, now
  if debt == 0 then
    tat, frac, sLimit, sWindow, last = 0, 0, 0, 0, 0 -- no debt left: absent, as a store drops it
  end
  local _, _, _, _, _, _, remaining, resetAfter = gcraDecide(tat, frac, sLimit, sWindow, last, p, now, 0, 0)
  return tat, frac, sLimit, sWindow, last, true, remaining, resetAfter, 0, charged, given, ceilDiv(mathMax(debt - tau, 0), window)
end

-- settleStep ports Policy.settle: it puts the decision in ds at offset o
-- and returns the write, then charged, given back and owed.
local function settleStep(p, st, now, spentAt, delta, ds, o)
  local k = p.kind
  local v, log, expires, limit = nil, nil, 0, p.limit
  local allowed, remaining, resetAfter, retryAfter, charged, given, owed
  if k == KIND_SLIDING_LOG then
    log, allowed, remaining, resetAfter, retryAfter, charged, given, owed = slidingLogSettle(st, p, now, spentAt, delta)
    if log.newest ~= 0 then
      expires = log.newest + p.window
    end
  else
    local a, b, c, d, e = st[1], st[2], st[3], st[4], st[5]
    if k == KIND_FIXED_WINDOW then
      a, b, c, allowed, remaining, resetAfter, retryAfter, charged, given, owed = fixedWindowSettle(a, b, c, p, now, spentAt, delta)
      d, e, expires = 0, 0, fixedWindowExpires(a, b, p)
    elseif k == KIND_FIXED_WINDOW_END then
      a, b, allowed, remaining, resetAfter, retryAfter, charged, given, owed = fixedWindowEndSettle(a, b, p, now, spentAt, delta)
      c, d, e, expires = 0, 0, 0, fixedWindowEndExpires(a, b)
    elseif k == KIND_FIXED_PERIOD then
      a, b, c, allowed, remaining, resetAfter, retryAfter, charged, given, owed = fixedPeriodSettle(a, b, c, p, now, spentAt, delta)
      d, e, expires = 0, 0, fixedPeriodExpires(a, b)
    elseif k == KIND_TOKEN_BUCKET then
      a, b, c, allowed, remaining, resetAfter, retryAfter, charged, given, owed = tokenBucketSettle(a, b, c, p, now, delta)
      d, e, expires, limit = 0, 0, tokenBucketExpires(a, b, c, p), p.burst
    else -- KIND_GCRA: algorithm.Check refuses the others first
      a, b, c, d, e, allowed, remaining, resetAfter, retryAfter, charged, given, owed = gcraSettle(a, b, c, d, e, p, now, delta)
      expires, limit = gcraExpires(a, b, c, d, e, p), p.burst
    end
    v = {a, b, c, d, e}
  end
  ds[o + 1] = allowed and 1 or 0
  ds[o + 2] = limit
  ds[o + 3] = remaining
  ds[o + 4] = resetAfter
  ds[o + 5] = retryAfter
  return {v = v, log = log, leases = nil, expires = expires, fresh = false}, charged, given, owed
end

-- estimateCorrupt ports EstimateCorrupt.
local function estimateCorrupt(extra)
  if #extra ~= 2 then
    return 'an estimate holds ' .. #extra .. ' integers beside its decisions: want 2'
  elseif extra[1] < 1 or extra[1] > MAX_LIMIT or extra[2] < 1 or extra[2] >= MAX_EXACT then
    return 'estimate of ' .. fmt(extra[1]) .. ' spent at ' .. fmt(extra[2]) .. ': want a cost of 1 to ' .. fmt(MAX_LIMIT) .. ' and a time in [1, 2^53)'
  end
  return nil
end

-- settledCorrupt ports SettledCorrupt.
local function settledCorrupt(extra, n)
  if #extra ~= 3 * n then
    return 'a settle holds ' .. #extra .. ' integers beside its ' .. n .. ' decisions: want ' .. 3 * n
  end
  for i = 1, #extra do
    if extra[i] < 0 or extra[i] > MAX_LIMIT then
      return 'settled value ' .. (i - 1) .. ' = ' .. fmt(extra[i]) .. ': want 0 to ' .. fmt(MAX_LIMIT)
    end
  end
  return nil
end

-- estimateOf ports estimateOf: the estimate rec ({decisions, extra,
-- others}, the decisions as recordLookup returns them, already held to
-- recordCorrupt), or nil, for a settle over n policies whose others are
-- others: the time it was spent at and its cost, or nil, nil and an error
-- table ({settle = reason}, {replay = …} or {corrupt = reason}).
local function estimateOf(rec, n, others)
  if rec == nil then
    return nil, nil, {settle = 'no estimate to settle under this evaluation id: none was spent with it on these policies for this subject, or its deadline passed (an estimate never settled stays spent)'}
  elseif #rec.decisions ~= 1 + DECISION_SIZE * n then
    return nil, nil, {replay = {first = (#rec.decisions - 1) / DECISION_SIZE, now = n}}
  end
  local why = estimateCorrupt(rec.extra)
  if why ~= nil then
    return nil, nil, {corrupt = why}
  end
  if rec.others ~= others then
    return nil, nil, {settle = OTHER_POLICIES}
  end
  for o = 2, #rec.decisions, DECISION_SIZE do
    if rec.decisions[o] ~= 1 then
      return nil, nil, {settle = 'the estimate under this evaluation id was denied: nothing was spent, nothing to settle'}
    end
  end
  return rec.extra[2], rec.extra[1], nil
end

-- lookupFor ports LookupFor, looking in the id keys zkey and hkey:
-- rawID is the evaluation id, id its record id.
local function lookupFor(ev, zkey, hkey, rawID, id, now)
  local vals, extra, ot = recordLookup(zkey, hkey, id, now)
  if vals ~= nil then
    ev.replay, ev.replayExtra, ev.replayOthers = vals, extra, ot
  end
  if ev.op == 'settle' then
    local ds, ex, ot = recordLookup(zkey, hkey, recordID(rawID, 'estimate'), now)
    if ds ~= nil then
      ev.estimate = {decisions = ds, extra = ex, others = ot}
    end
  end
end

-- evaluateSettle ports EvaluateSettle; ev.extra receives each policy's
-- charged, given back and owed. Errors are tables, as evaluate's, and
-- {settle = reason} (an estimate that cannot be settled) or {corrupt =
-- reason} (a record no estimate or settle leaves).
local function evaluateSettle(ev)
  local policies, states = ev.policies, ev.states
  local n, now = #policies, ev.now
  local ds, ws, extra = {0}, {}, {}
  ev.decisions, ev.writes, ev.extra = ds, ws, extra
  ev.commit, ev.replayed = false, false
  if ev.replay ~= nil then
    if #ev.replay ~= 1 + DECISION_SIZE * n then
      return {replay = {first = (#ev.replay - 1) / DECISION_SIZE, now = n}}
    end
    local why = settledCorrupt(ev.replayExtra, n)
    if why ~= nil then
      return {corrupt = why}
    end
    if ev.replayOthers ~= ev.others then
      return {settle = OTHER_POLICIES}
    end
    ev.decisions, ev.extra, ev.replayed = ev.replay, ev.replayExtra, true
    return nil
  end
  local spentAt, estimate, err = estimateOf(ev.estimate, n, ev.others)
  if err ~= nil then
    return err
  end
  for i = 1, n do
    local p = policies[i]
    local st, at, behind = current(p, states[i], now, ev.maxRegression)
    if st == nil then
      return {clock = {policy = i - 1, behind = behind, max = ev.maxRegression}}
    end
    local o = 1 + DECISION_SIZE * (i - 1)
    local w, charged, given, owed = settleStep(p, st, at, spentAt, ev.cost - estimate, ds, o)
    w.fresh = st ~= states[i]
    if at ~= now then
      lengthen(ds, o, at - now)
    end
    ws[i] = w
    local x = 3 * (i - 1)
    extra[x + 1], extra[x + 2], extra[x + 3] = charged, given, owed
  end
  ev.commit = true
  return nil
end
