--[[ params.lua ports internal/engine/algorithm/params.go: the bounds every
policy's numbers satisfy, Params.Check and the integer helpers
(Params.Capacity is Go's alone: only sluice.Policy's defaults use it).
Lua numbers are doubles, which hold every integer below 2^53 exactly;
every value here stays below it. Go's integer division and
remainder (truncated toward zero) are quo and rem. ]]

-- The library functions the decision calls, as locals: a function
-- library's global names are looked up through the sandbox's table on
-- every use, a local in one step. They are bound the first time decide
-- runs (while a library loads, Redis hides them).
local mathFloor, mathMax, mathMin, stringFormat, stringByte, stringFind
local structPack, structUnpack, redisCall, redisPcall, toNumber

-- bindLibrary binds the locals above.
local function bindLibrary()
  mathFloor, mathMax, mathMin = math.floor, math.max, math.min
  stringFormat, stringByte, stringFind = string.format, string.byte, string.find
  structPack, structUnpack = struct.pack, struct.unpack
  redisCall, redisPcall, toNumber = redis.call, redis.pcall, tonumber
end

local MIN_WINDOW = 1000 -- algorithm.MinWindow, µs
local MAX_WINDOW = 31536000000000 -- algorithm.MaxWindow, µs: 365 days
local MAX_LEASE_TTL = 86400000000 -- algorithm.MaxLeaseTTL, µs: 24h
local MAX_PERIOD = 31708800000000 -- algorithm.MaxPeriod, µs: 367 days
local MAX_LIMIT = 1000000000 -- algorithm.MaxLimit
local MAX_SLIDING_LOG_LEN = 100000 -- algorithm.MaxSlidingLogLen
local MAX_CONCURRENCY_LIMIT = 100000 -- algorithm.MaxConcurrencyLimit
local MAX_EXACT = 9007199254740992 -- algorithm.MaxExact, 2^53

-- The algorithms: algorithm.Kind.
local KIND_FIXED_WINDOW = 1
local KIND_SLIDING_LOG = 2
local KIND_SLIDING_WINDOW = 3
local KIND_TOKEN_BUCKET = 4
local KIND_GCRA = 5
local KIND_CONCURRENCY = 6
local KIND_FIXED_WINDOW_END = 7
local KIND_FIXED_PERIOD = 8

-- fdiv returns floor(a / b) exactly for integers |a| < 2^53, b > 0: the
-- double quotient is off by at most one, which the remainder corrects.
local function fdiv(a, b)
  local q = mathFloor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- quo is Go's a / b for b > 0.
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

-- ceilDiv ports ceilDiv.
local function ceilDiv(a, b)
  return quo(a + b - 1, b)
end

-- floorDiv ports floorDiv.
local function floorDiv(a, b)
  return fdiv(a, b)
end

-- verdictCost ports verdictCost.
local function verdictCost(cost)
  if cost == 0 then
    return 1
  end
  return cost
end

-- checkBounds ports Params.checkBounds: the field and the rule p's
-- periods (p.b0 to p.b3) break, or nil.
local function checkBounds(p)
  local b = {p.b0, p.b1, p.b2, p.b3}
  if b[1] < 1 or b[4] >= MAX_EXACT then
    return 'period', 'bounds must lie after the epoch and below 2^53 µs'
  end
  for i = 2, 4 do
    if b[i] <= b[i - 1] or b[i] - b[i - 1] > MAX_PERIOD then
      return 'period', 'each period must be 1µs to 367 days long, after the one before'
    end
  end
  if p.window ~= b[3] - b[2] then
    return 'window', 'must be the length of the period holding the caller\'s clock'
  end
  return nil
end

-- check ports Params.Check: the field and the rule p breaks for kind k, or nil.
local function check(p, k)
  if k == KIND_CONCURRENCY and (p.window < MIN_WINDOW or p.window > MAX_LEASE_TTL) then
    return 'window', 'must be between 1ms and 24h'
  elseif k ~= KIND_FIXED_PERIOD and (p.window < MIN_WINDOW or p.window > MAX_WINDOW) then
    return 'window', 'must be between 1ms and 365 days (8760h)'
  elseif p.limit < 1 or p.limit > MAX_LIMIT then
    return 'limit', 'must be between 1 and 1000000000'
  elseif p.burst < 1 or p.burst > MAX_LIMIT then
    return 'burst', 'must be between 1 and 1000000000'
  elseif p.aligned and k ~= KIND_FIXED_WINDOW and k ~= KIND_FIXED_WINDOW_END then
    return 'align', 'clock alignment applies only to fixed_window'
  end
  if k == KIND_FIXED_WINDOW or k == KIND_FIXED_WINDOW_END then
    return nil
  elseif k == KIND_FIXED_PERIOD then
    return checkBounds(p)
  elseif k == KIND_SLIDING_LOG then
    if p.limit > MAX_SLIDING_LOG_LEN then
      return 'limit', 'sliding_log allows at most 100000'
    end
  elseif k == KIND_SLIDING_WINDOW then
    if p.limit > quo(MAX_EXACT - 1, p.window) then
      return 'limit', 'limit × window in µs must stay below 2^53 for sliding_window'
    end
  elseif k == KIND_CONCURRENCY then
    if p.limit > MAX_CONCURRENCY_LIMIT then
      return 'limit', 'concurrency allows at most 100000'
    end
  elseif k == KIND_TOKEN_BUCKET or k == KIND_GCRA then
    if p.burst > quo(MAX_EXACT - 1 - p.limit, p.window) then
      return 'burst', 'burst × window in µs must stay below 2^53'
    end
  else
    return 'algorithm', 'unknown algorithm'
  end
  return nil
end
