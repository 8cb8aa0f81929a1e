--[[ args.lua: the arguments of a decision as redisstore.go writes them,
read and checked. Go twin: redisstore/redisstore.go, Store.decide and
Store.decideShort (they write what parsePolicy, policyOf and callerClock
read; the names ARGV_* are its argv* constants, TestLuaConstants holds
them equal), and internal/engine/algorithm/params.go's check (params.lua)
for a policy's numbers. ]]

-- LAYOUT: where redisstore.go puts each argument and reply field,
-- and the bounds of the arguments it checks. One table, not a local
-- each: a Lua function (the joined code is one) holds at most 200
-- locals.
local LAYOUT = {
  ARGV_COST = 1,
  ARGV_NOW = 2,
  ARGV_MAX_REGRESSION = 3,
  ARGV_OP = 4,
  ARGV_ID = 5,
  ARGV_DEDUPE_TTL = 6,
  ARGV_DEDUPE_MAX = 7,
  ARGV_CARRY = 8,
  ARGV_LEASE = 9,
  ARGV_HOLD = 10,
  ARGV_POLICIES = 10,
  ARGV_PER_POLICY = 1,
  REPLY_PER_POLICY = 5,
  CARRY_PER_POLICY = 2,
  REPLY_ABSENT = 2,
  MAX_GRACE = 90000000000, -- µs: CleanupGrace (1h) + ExtraTTL (24h)
  MAX_DEDUPE_TTL = 3600000000, -- µs
  MAX_DEDUPE_IDS = 10000,
}
local OPS = {spend = true, peek = true, refund = true, reset = true, acquire = true, release = true, renew = true, estimate = true, settle = true, book = true}

-- Policies whose arguments were read and checked, by their argument
-- string. A function library keeps this table from one call to the next
-- (a script, before Redis 7, starts every call with it empty), so a
-- policy's numbers are parsed and checked once, not on every decision;
-- the policies in it are never modified. It is emptied when it holds
-- CACHED.max policies.
local checked = {}

-- CACHED counts the entries of the caches of arguments read and checked
-- (checked here, short.lua's specs), each emptied when it holds max: one
-- table, not a local each (Lua's 200 locals).
local CACHED = {checked = 0, specs = 0, max = 1000}

-- parsePolicy reads and checks the argument of policy i, raw: the policy
-- as engine.lua takes it, with its TTL grace.
-- parsePolicy ports Store.argsOf's other side: it reads the policy argument argsOf writes, and Params.Check (check).
local function parsePolicy(raw, i)
  -- A priority class's reserve (Params.Reserve), when it has one, ends
  -- the argument as " r" and the units reserved.
  local body, reserve = string.match(raw, '^(.-) r(%d+)$')
  if body ~= nil then
    raw = body
  end
  local kind, limit, window, burst, grace, align = string.match(raw, '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) ([01])$')
  local b0, b1, b2, b3
  if kind == nil then -- a calendar period's: its periods' bounds follow
    kind, limit, window, burst, grace, align, b0, b1, b2, b3 = string.match(raw,
      '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) ([01]) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+)$')
  end
  local p = {kind = arg(kind), limit = arg(limit), window = arg(window), burst = arg(burst), grace = arg(grace), aligned = align == '1',
    b0 = arg(b0), b1 = arg(b1), b2 = arg(b2), b3 = arg(b3), reserve = arg(reserve or '0')}
  kind = p.kind
  if kind == nil or not (p.limit and p.window and p.burst and p.grace) then
    raise('SLUICE_ARGS', 'policy ' .. i .. ': want algorithm, limit, window, burst, grace and align (0 or 1) as integers joined by spaces')
  elseif (kind == KIND_FIXED_PERIOD) ~= (p.b3 ~= nil) or (p.b3 ~= nil and not (p.b0 and p.b1 and p.b2)) then
    raise('SLUICE_ARGS', 'policy ' .. i .. ': a calendar period (algorithm ' .. KIND_FIXED_PERIOD .. '), and only it, takes its four bounds after align, integers below 2^53')
  end
  local field, rule = check(p, kind)
  if field == nil and kind ~= KIND_TOKEN_BUCKET and kind ~= KIND_GCRA and p.burst ~= p.limit then
    field, rule = 'burst', 'applies only to token_bucket and gcra'
  elseif field == nil and (p.grace < 0 or p.grace > LAYOUT.MAX_GRACE) then
    field, rule = 'grace', 'must be between 0 and ' .. fmt(LAYOUT.MAX_GRACE) .. ' µs'
  elseif field == nil and (p.reserve == nil or p.reserve < 0 or p.reserve >= p.burst) then -- the capacity: burst, which is the limit but for a bucket
    field, rule = 'reserve', 'must be an integer from 0 to the capacity less 1'
  end
  if field ~= nil then
    raise('SLUICE_ARGS', 'policy ' .. i .. ': ' .. field .. ' ' .. rule)
  end
  return p
end

-- policyOf returns policy i, its argument raw, checked: the policy as
-- engine.lua takes it, with its TTL grace (p.grace).
-- policyOf ports Store.argsOf's cache: a policy's argument read once.
local function policyOf(raw, i)
  local p = checked[raw]
  if p == nil then
    p = parsePolicy(raw, i)
    if CACHED.checked >= CACHED.max then
      checked, CACHED.checked = {}, 0
    end
    checked[raw], CACHED.checked = p, CACHED.checked + 1
  end
  return p
end

-- redisTime returns the time of this call by Redis TIME, in µs.
local function redisTime()
  local t = redisCall('TIME')
  return toNumber(t[1]) * 1000000 + toNumber(t[2])
end

-- callerClock returns the caller's time now and its maximum clock
-- regression, read from their arguments and checked.
-- callerClock ports Store.decide's other side: the caller's now and maximum regression it writes.
local function callerClock(rawNow, rawRegression)
  local now, maxRegression = arg(rawNow), arg(rawRegression)
  if now == nil or now < 1 or now >= MAX_EXACT then
    raise('SLUICE_ARGS', 'now must be an integer number of µs in [1, 2^53)')
  end
  if maxRegression == nil or maxRegression < -1 then
    raise('SLUICE_ARGS', 'maximum clock regression must be an integer >= -1')
  end
  return now, maxRegression
end

-- clockUnsafe raises SLUICE_CLOCK: the caller's clock lies behind the
-- newest write to key by more than maxRegression.
-- clockUnsafe ports Store.classify's other side: SLUICE_CLOCK, read as ClockUnsafe.
local function clockUnsafe(key, behind, maxRegression)
  raise('SLUICE_CLOCK', key .. ': caller clock is ' .. fmt(behind) ..
    ' µs behind the last write, more than the allowed ' .. fmt(maxRegression))
end
