--[[
decide.lua: one sluice decision, atomically, for one subject and one or
more policies: either every policy admits the cost and it is spent on all of
them, or nothing is written.

KEYS[1..n]  the state key of policy i: <prefix>{<subject>}<policy id>:<revision>:<algorithm code>.
         With an evaluation id, KEYS[n+1] is the sorted set of remembered ids
         (score: expiry in µs) and KEYS[n+2] the hash id -> remembered reply,
         both of the first policy. All keys of one call share the subject's
         hash tag (one Cluster slot).
ARGV[1]  cost, an integer >= 0; 0 is a peek: judged as a cost of 1, writes nothing.
ARGV[2]  now in integer microseconds since the Unix epoch (caller clock), or
         "" to read the time with Redis TIME (one clock for every caller).
ARGV[3]  caller clock only: the most, in microseconds, now may lie behind the
         newest now a key was written at; -1 means unbounded.
ARGV[4]  "spend" (or peek, by cost 0) or "refund": give cost units back.
ARGV[5]  the evaluation id ("s:<id>" for spends, "r:<id>" for refunds), or "".
ARGV[6]  how long a decision for an id is remembered, µs (DedupeTTL).
ARGV[7]  how many ids are remembered at most (DedupeMax).
ARGV[8+5(i-1) .. 12+5(i-1)]  policy i: algorithm (1 fixed_window, 2 sliding_log,
         3 sliding_window, 4 token_bucket, 5 gcra), limit, window in
         microseconds, burst, TTL grace in microseconds (CleanupGrace + ExtraTTL).

Reply: replayed (1 when the reply is the remembered one of the evaluation id,
else 0), then a flat array of 5 integers per policy, in KEYS order: allowed
(1 or 0), limit, remaining, reset_after (µs), retry_after (µs). When several
policies are named and one denies, the ones that would have admitted report
their unspent state (a peek's remaining and reset_after), still allowed. A
refund is always allowed and reports the peek after it. Errors, raised before
any write: "SLUICE_ARGS <reason>", "SLUICE_CORRUPT <key>: <reason>" (state this
script did not write: wrong type, a non-integer, a missing field, no TTL),
"SLUICE_CLOCK <key>: <reason>" (caller clock too far behind).

Time source: ARGV[2] or Redis TIME, never both. Every written key gets
PEXPIRE = ceil((Expires(state) - now + grace) / 1000) ms, now being the
unclamped time of this call, so a key never vanishes before its state equals
absent. Needs Redis >= 5 (effects replication of a script that calls TIME).

Each decide and refund function below is a line-by-line port of the Go
function it names in internal/algorithm; memstore's Evaluate (with its
dedupe records) is ported by main. All
arithmetic is on integers below 2^53, exact in Lua's doubles; Go's integer
division, remainder and the helpers of algorithm/params.go are quo, rem,
ceilDiv and floorDiv.
]]

local EXACT = 9007199254740992 -- 2^53, algorithm.MaxExact

-- raise aborts the decision with a SLUICE_* error reply (caught in the
-- pcall at the bottom; nothing has been written when it is raised).
local function raise(code, msg)
  error({sluice = code .. ' ' .. msg})
end

local function corrupt(key, msg)
  raise('SLUICE_CORRUPT', key .. ': ' .. msg)
end

-- int parses a decimal integer string of magnitude <= 2^53, or returns nil.
local function int(s)
  if type(s) ~= 'string' or #s > 17 or not string.find(s, '^%-?%d+$') then
    return nil
  end
  local n = tonumber(s)
  if n > EXACT or n < -EXACT then
    return nil
  end
  return n
end

local function fmt(n)
  return string.format('%.0f', n)
end

-- fdiv returns floor(a / b) exactly for integers |a| < 2^53, b > 0: the
-- double quotient is off by at most one, which the remainder corrects.
local function fdiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- quo is Go's a / b (truncated toward zero) for b > 0.
local function quo(a, b)
  if a >= 0 then
    return fdiv(a, b)
  end
  return -fdiv(-a, b)
end

-- rem is Go's a % b for b > 0.
local function rem(a, b)
  return a - quo(a, b) * b
end

-- ceilDiv ports algorithm.ceilDiv: (a + b - 1) / b.
local function ceilDiv(a, b)
  return quo(a + b - 1, b)
end

-- floorDiv ports algorithm.floorDiv.
local function floorDiv(a, b)
  return fdiv(a, b)
end

-- verdictCost ports algorithm.verdictCost.
local function verdictCost(cost)
  if cost == 0 then
    return 1
  end
  return cost
end

local function decision(limit)
  return {allowed = false, limit = limit, remaining = 0, reset = 0, retry = 0}
end

-- checkParams ports algorithm.Params.Check and the cost bound of
-- Params.Capacity.
local function checkParams(i, kind, p, cost)
  local bad
  if p.window < 1000 or p.window > 86400000000 then
    bad = 'window must be between 1000 and 86400000000 µs'
  elseif p.limit < 1 or p.limit > 1000000000 then
    bad = 'limit must be between 1 and 1000000000'
  elseif p.burst < 1 or p.burst > 1000000000 then
    bad = 'burst must be between 1 and 1000000000'
  elseif p.grace < 0 or p.grace > 90000000000 then
    bad = 'grace must be between 0 and 90000000000 µs'
  elseif kind == 2 and p.limit > 100000 then
    bad = 'sliding_log limit must be at most 100000'
  elseif kind == 3 and p.limit > quo(EXACT - 1, p.window) then
    bad = 'sliding_window limit × window must stay below 2^53'
  elseif (kind == 4 or kind == 5) and p.burst > quo(EXACT - 1 - p.limit, p.window) then
    bad = 'burst × window must stay below 2^53'
  elseif kind ~= 4 and kind ~= 5 and p.burst ~= p.limit then
    bad = 'burst applies only to token_bucket and gcra'
  else
    local capacity = p.limit
    if kind == 4 or kind == 5 then
      capacity = p.burst
    end
    if cost > capacity then
      bad = 'cost ' .. fmt(cost) .. ' is above the capacity ' .. fmt(capacity)
    end
  end
  if bad then
    raise('SLUICE_ARGS', 'policy ' .. i .. ': ' .. bad)
  end
end

-- readHash returns the integer fields of the hash at key, or nil when the
-- key does not exist. Anything else than a hash with a TTL whose fields are
-- all integers >= 0 is corrupt.
local function readHash(key, fields)
  local ttl = redis.call('PTTL', key)
  if ttl == -2 then
    return nil
  end
  if ttl == -1 then
    corrupt(key, 'has no TTL')
  end
  local vals = redis.pcall('HMGET', key, unpack(fields))
  if vals.err then
    corrupt(key, 'is not a hash: ' .. vals.err)
  end
  local st = {}
  for i, f in ipairs(fields) do
    local v = int(vals[i])
    if v == nil or v < 0 then
      if vals[i] == false then
        corrupt(key, 'field ' .. f .. ' is missing')
      end
      corrupt(key, 'field ' .. f .. ' = ' .. string.sub(tostring(vals[i]), 1, 40) .. ': want an integer >= 0')
    end
    st[f] = v
  end
  return st
end

-- checkClock raises SLUICE_CLOCK when now lies more than maxreg behind
-- last, the newest time the key was written at.
local function checkClock(key, now, last, maxreg)
  if maxreg >= 0 and last - now > maxreg then
    raise('SLUICE_CLOCK', key .. ': caller clock is ' .. fmt(last - now) ..
      ' µs behind the last write, more than the allowed ' .. fmt(maxreg))
  end
end

------------------------------------------------------------------------
-- fixed_window: hash {s = Start, c = Count, t = newest write time}

-- fixedWindow ports algorithm.FixedWindow.Decide.
local function fixedWindow(s, p, now, cost)
  if s.start ~= 0 and now < s.start then
    now = s.start
  end
  if s.start == 0 or now >= s.start + p.window then
    s = {start = now, count = 0}
  end
  local d = decision(p.limit)
  local need = verdictCost(cost)
  if s.count + need > p.limit then
    d.remaining = math.max(p.limit - s.count, 0) -- Count > Limit after a limit was lowered
    d.reset = s.start + p.window - now
    d.retry = d.reset
    return s, d
  end
  if cost > 0 then
    s = {start = s.start, count = s.count + cost}
  end
  d.allowed = true
  d.remaining = p.limit - s.count
  if s.count > 0 then
    d.reset = s.start + p.window - now
  end
  return s, d
end


-- fixedWindowExpires ports algorithm.FixedWindow.Expires.
local function fixedWindowExpires(s, p)
  if s.count == 0 then
    return 0
  end
  return s.start + p.window
end

-- fixedWindowRefund ports algorithm.FixedWindow.Refund.
local function fixedWindowRefund(s, p, now, n)
  if s.start ~= 0 and math.max(now, s.start) < s.start + p.window then
    s = {start = s.start, count = math.max(s.count - n, 0)}
  end
  if fixedWindowExpires(s, p) <= now then
    s = {start = 0, count = 0} -- nothing left to remember: absent, deleted by apply
  end
  local _, d = fixedWindow(s, p, now, 0)
  d.allowed, d.retry = true, 0
  return s, d
end

------------------------------------------------------------------------
-- sliding_window: hash {s = Start, c = Curr, p = Prev, t = newest write time}

-- slidingWindowAdvance ports algorithm.SlidingWindow.advance.
local function slidingWindowAdvance(s, p, now)
  local w = now - rem(now, p.window)
  if w <= s.start then
    return s
  elseif w == s.start + p.window then
    return {start = w, curr = 0, prev = s.curr}
  end
  return {start = w, curr = 0, prev = 0}
end

-- slidingWindowResetAfter ports algorithm.SlidingWindow.resetAfter.
local function slidingWindowResetAfter(s, p, elapsed)
  if s.curr > 0 then
    return 2 * p.window - elapsed
  elseif s.prev > 0 then
    return p.window - elapsed
  end
  return 0
end

-- slidingWindow ports algorithm.SlidingWindow.Decide.
local function slidingWindow(s, p, now, cost)
  if s.start ~= 0 and now < s.start then
    now = s.start
  end
  s = slidingWindowAdvance(s, p, now)
  local elapsed = now - s.start
  -- All quantities below are scaled by Window.
  local weighted = s.prev * (p.window - elapsed) + s.curr * p.window
  local capacity = p.limit * p.window
  local d = decision(p.limit)
  local need = verdictCost(cost)
  -- weighted + need*window may pass 2^53 and round, but only when it is far
  -- above capacity (< 2^53), so the comparison stays exact.
  if weighted + need * p.window > capacity then
    d.remaining = quo(math.max(capacity - weighted, 0), p.window) -- above capacity after a limit was lowered
    d.reset = slidingWindowResetAfter(s, p, elapsed)
    if s.curr + need <= p.limit then
      -- Wait for the previous window's share to decay enough.
      local at = p.window - quo((p.limit - s.curr - need) * p.window, s.prev)
      d.retry = at - elapsed
    else
      -- Wait for the next window, where Curr becomes Prev.
      local at = p.window - quo((p.limit - need) * p.window, s.curr)
      d.retry = p.window - elapsed + at
    end
    return s, d
  end
  if cost > 0 then
    s = {start = s.start, curr = s.curr + cost, prev = s.prev}
    weighted = weighted + cost * p.window
  end
  d.allowed = true
  d.remaining = quo(capacity - weighted, p.window)
  d.reset = slidingWindowResetAfter(s, p, elapsed)
  return s, d
end

-- slidingWindowExpires ports algorithm.SlidingWindow.Expires.
local function slidingWindowExpires(s, p)
  if s.curr > 0 then
    return s.start + 2 * p.window
  elseif s.prev > 0 then
    return s.start + p.window
  end
  return 0
end

------------------------------------------------------------------------
-- token_bucket: hash {k = Tokens, l = Last, w = Window}; Last is the newest
-- write time.

-- tokenBucketTokens ports algorithm.TokenBucket.tokens.
local function tokenBucketTokens(s, p)
  if s.window ~= 0 and s.window ~= p.window then
    return math.min(quo(s.tokens, s.window), p.burst) * p.window
  end
  return math.min(s.tokens, p.burst * p.window)
end

-- tokenBucketLevel ports algorithm.TokenBucket.level.
local function tokenBucketLevel(s, p, now)
  local full = p.burst * p.window
  if s.last == 0 then
    return full, now
  end
  if now < s.last then
    now = s.last
  end
  local tokens = tokenBucketTokens(s, p)
  -- Refill, capping the elapsed time first.
  local elapsed = now - s.last
  if elapsed >= ceilDiv(full - tokens, p.limit) then
    return full, now
  end
  return tokens + elapsed * p.limit, now
end

-- tokenBucket ports algorithm.TokenBucket.Decide.
local function tokenBucket(s, p, now, cost)
  local full = p.burst * p.window
  local tokens
  tokens, now = tokenBucketLevel(s, p, now)
  local d = decision(p.burst)
  local need = verdictCost(cost) * p.window
  if tokens < need then
    d.remaining = quo(tokens, p.window)
    d.retry = ceilDiv(need - tokens, p.limit)
    d.reset = ceilDiv(full - tokens, p.limit)
    return s, d
  end
  if cost > 0 then
    tokens = tokens - cost * p.window
    s = {tokens = tokens, last = now, window = p.window}
  end
  d.allowed = true
  d.remaining = quo(tokens, p.window)
  d.reset = ceilDiv(full - tokens, p.limit)
  return s, d
end


-- tokenBucketExpires ports algorithm.TokenBucket.Expires.
local function tokenBucketExpires(s, p)
  if s.last == 0 then
    return 0
  end
  return s.last + ceilDiv(p.burst * p.window - tokenBucketTokens(s, p), p.limit)
end

-- tokenBucketRefund ports algorithm.TokenBucket.Refund.
local function tokenBucketRefund(s, p, now, n)
  if s.last ~= 0 then
    local tokens, at = tokenBucketLevel(s, p, now)
    -- tokens + n*window may pass 2^53 and round, but only far above the
    -- full bucket (< 2^53), so the min stays exact.
    s = {tokens = math.min(tokens + n * p.window, p.burst * p.window), last = at, window = p.window}
    if tokenBucketExpires(s, p) <= now then
      s = {tokens = 0, last = 0, window = 0} -- full: absent, deleted by apply
    end
  end
  local _, d = tokenBucket(s, p, now, 0)
  d.allowed, d.retry = true, 0
  return s, d
end

------------------------------------------------------------------------
-- gcra: hash {a = TAT, f = Frac, r = Limit, w = Window, t = Last, the
-- newest write time}

-- gcraScheduledUnder ports algorithm.GCRA.scheduledUnder.
local function gcraScheduledUnder(s, p)
  return (s.limit == p.limit and s.window == p.window) or s.tat == 0 or s.limit == 0 or s.window == 0
end

-- gcraReschedule ports algorithm.GCRA.reschedule.
local function gcraReschedule(s, p)
  local units = 0 -- nothing outstanding when the TAT is not after Last
  local ahead = s.tat - s.last
  if ahead > quo(EXACT - 1 - s.frac, s.limit) then
    units = p.burst -- scheduled absurdly far ahead: as many as fit
  elseif ahead >= 0 then
    units = math.min(ceilDiv(ahead * s.limit + s.frac, s.window), p.burst)
  end
  local debt = units * p.window
  return {tat = s.last + quo(debt, p.limit), frac = rem(debt, p.limit), limit = p.limit, window = p.window, last = s.last}
end

-- gcra ports algorithm.GCRA.Decide.
local function gcra(s, p, now, cost)
  local stored = s
  if not gcraScheduledUnder(s, p) then
    s = gcraReschedule(s, p)
  end
  local tau = p.burst * p.window -- Burst·T, scaled by Limit
  local need = verdictCost(cost) * p.window
  local d = decision(p.burst)
  -- debt is (TAT - now) scaled by Limit, or 0 when the TAT is past.
  local debt = 0
  local ahead = s.tat - now
  if s.tat ~= 0 and ahead >= 0 then
    if ahead > quo(tau, p.limit) + 1 then
      -- Further ahead than any admissible debt (a clock that went backwards).
      d.retry = ahead - floorDiv(tau - need - s.frac, p.limit)
      d.reset = ahead + ceilDiv(s.frac, p.limit)
      return stored, d
    end
    debt = ahead * p.limit + s.frac
  end
  -- Go: debt+need > tau. debt - tau is formed first: debt + need may pass
  -- 2^53, debt - tau + need stays small.
  if debt - tau + need > 0 then
    d.remaining = quo(math.max(tau - debt, 0), p.window)
    d.retry = ceilDiv(debt - tau + need, p.limit)
    d.reset = ceilDiv(debt, p.limit)
    return stored, d
  end
  -- A state that expired equals absent: its Last does not carry over.
  local last = now
  if s.tat ~= 0 and s.tat + math.min(s.frac, 1) > now then
    last = math.max(stored.last, now)
  end
  s = stored
  if cost > 0 then
    debt = debt + cost * p.window
    s = {tat = now + quo(debt, p.limit), frac = rem(debt, p.limit), limit = p.limit, window = p.window, last = last}
  end
  d.allowed = true
  d.remaining = quo(tau - debt, p.window)
  d.reset = ceilDiv(debt, p.limit)
  return s, d
end


-- gcraExpires ports algorithm.GCRA.Expires.
local function gcraExpires(s, p)
  if not gcraScheduledUnder(s, p) then
    s = gcraReschedule(s, p)
  end
  if s.tat == 0 then
    return 0
  end
  return s.tat + math.min(s.frac, 1) -- a remainder rounds up
end

-- gcraRefund ports algorithm.GCRA.Refund.
local function gcraRefund(s, p, now, n)
  if not gcraScheduledUnder(s, p) then
    s = gcraReschedule(s, p)
  end
  if s.tat ~= 0 then
    local last = math.max(s.last, now)
    local back = n * p.window -- n·T scaled by Limit, below 2^53 since n <= Burst
    local tat = s.tat - quo(back, p.limit)
    local frac = s.frac - rem(back, p.limit)
    if frac < 0 then
      frac = frac + p.limit
      tat = tat - 1
    end
    s = {tat = tat, frac = frac, limit = s.limit, window = s.window, last = last}
    if gcraExpires(s, p) <= now then
      s = {tat = 0, frac = 0, limit = 0, window = 0, last = 0} -- no debt left: absent, deleted by apply
    end
  end
  local _, d = gcra(s, p, now, 0)
  d.allowed, d.retry = true, 0
  return s, d
end

------------------------------------------------------------------------
-- Hash-backed algorithms: how each maps to its fields.

local HASH = {
  [1] = {
    fields = {'s', 'c', 't'},
    load = function(h) return {start = h.s, count = h.c}, h.t end,
    store = function(s, t) return {'s', fmt(s.start), 'c', fmt(s.count), 't', fmt(t)} end,
    decide = fixedWindow, refund = fixedWindowRefund, expires = fixedWindowExpires,
    absent = {start = 0, count = 0},
  },
  [3] = {
    fields = {'s', 'c', 'p', 't'},
    load = function(h) return {start = h.s, curr = h.c, prev = h.p}, h.t end,
    store = function(s, t) return {'s', fmt(s.start), 'c', fmt(s.curr), 'p', fmt(s.prev), 't', fmt(t)} end,
    decide = slidingWindow, expires = slidingWindowExpires,
    absent = {start = 0, curr = 0, prev = 0},
  },
  [4] = {
    fields = {'k', 'l', 'w'},
    load = function(h) return {tokens = h.k, last = h.l, window = h.w}, h.l end,
    store = function(s) return {'k', fmt(s.tokens), 'l', fmt(s.last), 'w', fmt(s.window)} end,
    decide = tokenBucket, refund = tokenBucketRefund, expires = tokenBucketExpires,
    absent = {tokens = 0, last = 0, window = 0},
  },
  [5] = {
    fields = {'a', 'f', 'r', 'w', 't'},
    load = function(h) return {tat = h.a, frac = h.f, limit = h.r, window = h.w, last = h.t}, h.t end,
    store = function(s, t) return {'a', fmt(s.tat), 'f', fmt(s.frac), 'r', fmt(s.limit), 'w', fmt(s.window), 't', fmt(t)} end,
    decide = gcra, refund = gcraRefund, expires = gcraExpires,
    absent = {tat = 0, frac = 0, limit = 0, window = 0, last = 0},
  },
}

-- decideHash reads, validates and decides (or refunds) one hash-backed
-- policy; the returned write, if any, is applied only when the whole
-- decision admits.
local function decideHash(key, kind, p, now, cost, maxreg, refund)
  local a = HASH[kind]
  local s, last = a.absent, 0
  local h = readHash(key, a.fields)
  if h then
    s, last = a.load(h)
    if now >= a.expires(s, p) then
      -- memstore: an expired state is absent (and the decisions agree).
      s, last = a.absent, 0
    else
      checkClock(key, now, last, maxreg)
    end
  end
  local ns, d
  if refund then
    ns, d = a.refund(s, p, now, cost)
  else
    ns, d = a.decide(s, p, now, cost)
  end
  local peek = function()
    local _, pd = a.decide(s, p, now, 0)
    return pd
  end
  if not d.allowed or cost == 0 then
    return d, nil, peek
  end
  -- The newest write time; for gcra this is its Last (an expired state
  -- was read as absent above, so its time does not carry over).
  local t = math.max(last, now)
  return d, {hash = a.store(ns, t), expires = a.expires(ns, p)}, peek
end

------------------------------------------------------------------------
-- sliding_log: a list of admission times in µs, ascending, one per unit.
-- Its last entry is the newest write time.

-- logEntry returns entry i (0-based) of the list at key.
local function logEntry(key, i)
  local raw = redis.call('LINDEX', key, i)
  local v = int(raw)
  if v == nil or v < 0 then
    corrupt(key, 'entry ' .. i .. ' = ' .. string.sub(tostring(raw), 1, 40) .. ': want an integer >= 0')
  end
  return v
end

-- slidingLog ports algorithm.SlidingLog.Decide (with its trim), or with
-- refund set algorithm.SlidingLog.Refund, over the list at key, reading only
-- the entries it needs: the newest, the cut point (by binary search; the
-- list is sorted) and the one that frees room.
local slidingLog
slidingLog = function(key, p, now, cost, maxreg, refund)
  local n, newest = 0, 0
  local ttl = redis.call('PTTL', key)
  if ttl == -1 then
    corrupt(key, 'has no TTL')
  end
  if ttl ~= -2 then
    local len = redis.pcall('LLEN', key)
    if type(len) == 'table' and len.err then
      corrupt(key, 'is not a list: ' .. len.err)
    end
    n = len
    if n > 0 then
      newest = logEntry(key, n - 1)
    end
  end
  local cut = 0
  if n > 0 and now >= newest + p.window then
    -- memstore: an expired state is absent; every entry is dropped.
    cut = n
  elseif n > 0 then
    checkClock(key, now, newest, maxreg)
    -- Trim: a clock behind the newest entry is treated as its time.
    if now < newest then
      now = newest
    end
    -- Drop entries that left the window: at <= now-Window. The newest stays.
    local lo, hi = 0, n - 1
    while lo < hi do
      local mid = fdiv(lo + hi, 2)
      if logEntry(key, mid) <= now - p.window then
        lo = mid + 1
      else
        hi = mid
      end
    end
    cut = lo
  end
  local count = n - cut
  local d = decision(p.limit)
  if refund then
    -- Refund: drop up to cost of the newest entries, then report as a peek.
    local drop = math.min(cost, count)
    local left = count - drop
    d.allowed = true
    d.remaining = math.max(p.limit - left, 0)
    local expires = 0
    if left > 0 then
      local newest = logEntry(key, cut + left - 1)
      d.reset = newest + p.window - now
      expires = newest + p.window
    end
    return d, {log = true, cut = cut, drop = drop, cost = 0, at = now, expires = expires}, nil
  end
  local need = verdictCost(cost)
  local peek = function()
    return slidingLog(key, p, now, 0, maxreg)
  end
  if count + need > p.limit then
    -- The entry whose expiry frees enough room: the (count+need-Limit)-th oldest.
    d.remaining = math.max(p.limit - count, 0) -- count > Limit after a limit was lowered
    d.retry = logEntry(key, cut + count + need - p.limit - 1) + p.window - now
    d.reset = newest + p.window - now
    return d, nil, peek
  end
  d.allowed = true
  d.remaining = p.limit - count - cost
  if cost > 0 then
    d.reset = p.window -- the newest entry is now
  elseif count > 0 then
    d.reset = newest + p.window - now
  end
  if cost == 0 then
    return d, nil, peek
  end
  return d, {log = true, cut = cut, drop = 0, at = now, cost = cost, expires = now + p.window}, peek
end

------------------------------------------------------------------------

-- apply performs one policy's write and sets the key's TTL; a state that
-- equals absent (after a refund) is deleted.
local function apply(key, w, now, grace)
  if w.expires <= now then
    redis.call('DEL', key)
    return
  end
  if w.log then
    if w.cut > 0 or w.drop > 0 then
      redis.call('LTRIM', key, w.cut, -1 - w.drop)
    end
    local v = fmt(w.at)
    local left = w.cost
    while left > 0 do
      local batch = {}
      for j = 1, math.min(left, 1000) do
        batch[j] = v
      end
      redis.call('RPUSH', key, unpack(batch))
      left = left - #batch
    end
  else
    redis.call('HSET', key, unpack(w.hash))
  end
  local ms = ceilDiv(w.expires - now + grace, 1000)
  if ms < 1 then
    ms = 1
  end
  redis.call('PEXPIRE', key, fmt(ms))
end

------------------------------------------------------------------------
-- Evaluation ids: a sorted set (member: id, score: expiry in µs) and a hash
-- (id -> the reply's integers, comma-separated) per subject and first
-- policy, as memstore's dedupeLog.

-- dedupeLookup returns the remembered reply for id, or nil when there is
-- none or it expired (score <= now).
local function dedupeLookup(zkey, hkey, id, now, n)
  for _, key in ipairs({zkey, hkey}) do
    if redis.call('PTTL', key) == -1 then
      corrupt(key, 'has no TTL')
    end
  end
  local score = redis.pcall('ZSCORE', zkey, id)
  if type(score) == 'table' and score.err then
    corrupt(zkey, 'is not a sorted set: ' .. score.err)
  end
  if not score then
    return nil
  end
  local expires = int(score)
  if expires == nil then
    corrupt(zkey, 'score of an id = ' .. tostring(score) .. ': want an integer')
  end
  if expires <= now then
    return nil
  end
  local raw = redis.pcall('HGET', hkey, id)
  if type(raw) == 'table' and raw.err then
    corrupt(hkey, 'is not a hash: ' .. raw.err)
  end
  if not raw then
    corrupt(hkey, 'holds no reply for a remembered id')
  end
  local reply = {1}
  for v in string.gmatch(raw, '[^,]+') do
    local x = int(v)
    if x == nil then
      corrupt(hkey, 'a remembered reply holds ' .. string.sub(v, 1, 40) .. ': want integers')
    end
    reply[#reply + 1] = x
  end
  if #reply ~= 1 + 5 * n then
    raise('SLUICE_ARGS', 'the evaluation id was first used with ' .. fmt((#reply - 1) / 5) .. ' policies, now with ' .. n)
  end
  return reply
end

-- hdel deletes fields from the hash at key, 1000 at a time: Lua's unpack
-- fails on a few thousand values, and up to 10000 ids may go at once.
local function hdel(key, fields)
  for i = 1, #fields, 1000 do
    redis.call('HDEL', key, unpack(fields, i, math.min(i + 999, #fields)))
  end
end

-- dedupeRemember records reply for id until now + ttl, forgetting expired
-- ids and, beyond max, the oldest; the keys live until the newest record
-- expires, plus grace.
local function dedupeRemember(zkey, hkey, id, now, ttl, max, grace, reply)
  local expired = redis.call('ZRANGEBYSCORE', zkey, '-inf', fmt(now))
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', zkey, '-inf', fmt(now))
    hdel(hkey, expired)
  end
  local vals = {}
  for i = 2, #reply do
    vals[i - 1] = fmt(reply[i])
  end
  redis.call('HSET', hkey, id, table.concat(vals, ','))
  redis.call('ZADD', zkey, fmt(now + ttl), id)
  local over = redis.call('ZCARD', zkey) - max
  if over > 0 then
    local oldest = redis.call('ZRANGE', zkey, 0, over - 1)
    redis.call('ZREMRANGEBYRANK', zkey, 0, over - 1)
    hdel(hkey, oldest)
  end
  local ms = fmt(ceilDiv(ttl + grace, 1000))
  redis.call('PEXPIRE', zkey, ms)
  redis.call('PEXPIRE', hkey, ms)
end

------------------------------------------------------------------------

-- main ports memstore.Store.Evaluate: replay a remembered id, or decide
-- every policy, then write all or nothing, and remember the reply.
local function main()
  local id = ARGV[5] or ''
  local n = #KEYS
  if id ~= '' then
    n = n - 2
  end
  if n < 1 or #ARGV ~= 7 + 5 * n then
    raise('SLUICE_ARGS', 'want 7 + 5 ARGV per policy key, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
  end
  local cost = int(ARGV[1])
  if cost == nil or cost < 0 then
    raise('SLUICE_ARGS', 'cost must be an integer >= 0')
  end
  local refund = ARGV[4] == 'refund'
  if not refund and ARGV[4] ~= 'spend' then
    raise('SLUICE_ARGS', 'mode must be spend or refund')
  end
  if refund and cost < 1 then
    raise('SLUICE_ARGS', 'a refund gives back a cost >= 1')
  end
  local dttl, dmax
  if id ~= '' then
    dttl, dmax = int(ARGV[6]), int(ARGV[7])
    if cost == 0 then
      raise('SLUICE_ARGS', 'a peek is never remembered: send no evaluation id')
    end
    if dttl == nil or dttl < 1000 or dttl > 3600000000 or dmax == nil or dmax < 1 or dmax > 10000 then
      raise('SLUICE_ARGS', 'dedupe TTL must be 1000 to 3600000000 µs and dedupe max 1 to 10000')
    end
  end
  local now
  local maxreg = -1
  if ARGV[2] == '' then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  else
    now = int(ARGV[2])
    maxreg = int(ARGV[3])
    if now == nil or now < 1 or now >= EXACT then
      raise('SLUICE_ARGS', 'now must be an integer number of µs in [1, 2^53)')
    end
    if maxreg == nil or maxreg < -1 then
      raise('SLUICE_ARGS', 'maximum clock regression must be an integer >= -1')
    end
  end
  if id ~= '' then
    local replay = dedupeLookup(KEYS[n + 1], KEYS[n + 2], id, now, n)
    if replay then
      return replay
    end
  end

  local reply, writes, peeks, allowed = {0}, {}, {}, {}
  local admitted = true
  for i = 1, n do
    local base = 7 + 5 * (i - 1)
    local kind = int(ARGV[base + 1])
    local p = {limit = int(ARGV[base + 2]), window = int(ARGV[base + 3]), burst = int(ARGV[base + 4]), grace = int(ARGV[base + 5])}
    if kind == nil or kind < 1 or kind > 5 or not (p.limit and p.window and p.burst and p.grace) then
      raise('SLUICE_ARGS', 'policy ' .. i .. ': algorithm, limit, window, burst and grace must be integers, algorithm 1 to 5')
    end
    checkParams(i, kind, p, cost)
    if refund and kind == 3 then
      raise('SLUICE_ARGS', 'policy ' .. i .. ': sliding_window has no refund')
    end
    local d, w
    if kind == 2 then
      d, w, peeks[i] = slidingLog(KEYS[i], p, now, cost, maxreg, refund)
    else
      d, w, peeks[i] = decideHash(KEYS[i], kind, p, now, cost, maxreg, refund)
    end
    if not d.allowed then
      admitted = false
    end
    allowed[i] = d.allowed
    writes[i] = w or false
    local k = 1 + 5 * (i - 1)
    reply[k + 1] = d.allowed and 1 or 0
    reply[k + 2] = d.limit
    reply[k + 3] = d.remaining
    reply[k + 4] = d.reset
    reply[k + 5] = d.retry
  end
  if not admitted and n > 1 then
    -- Nothing is spent: a policy that would have admitted reports its
    -- unspent state, as a peek does, still admitting the cost.
    for i = 1, n do
      if allowed[i] then
        local d = peeks[i]()
        local k = 1 + 5 * (i - 1)
        reply[k + 3] = d.remaining
        reply[k + 4] = d.reset
        reply[k + 5] = 0
      end
    end
  end
  if admitted and cost > 0 then
    for i = 1, n do
      if writes[i] then
        apply(KEYS[i], writes[i], now, int(ARGV[7 + 5 * (i - 1) + 5]))
      end
    end
  end
  if id ~= '' then
    dedupeRemember(KEYS[n + 1], KEYS[n + 2], id, now, dttl, dmax, int(ARGV[12]), reply)
  end
  return reply
end

local ok, res = pcall(main)
if ok then
  return res
end
if type(res) == 'table' and res.sluice then
  return redis.error_reply(res.sluice)
end
error(res)
