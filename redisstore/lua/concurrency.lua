--[[ concurrency.lua ports internal/engine/algorithm/concurrency.go. The leases
of one subject under one policy are a Redis sorted set: member the lease
id, score its expiry in µs. A state here is a view of it, {key, len,
newest, latest}; s.Expiries[i] of the Go code is concurrencyEntry(s, i), one
ZRANGE, and s.find(id) one ZRANK. An edit is a table {cut, remove, add,
at, newest}, '' naming no lease; a decision is the values allowed,
remaining, resetAfter and retryAfter (its limit is p.limit). Leases whose
expiries tie are ordered by id in Redis and by insertion in Go: the math
reads expiries only, which agree.

Every expiry read is checked against what the script writes (it has no
Go twin: memstore reads only what it wrote): an integer >= 1 within
(latest − 24h, latest], since a write sweeps the leases expired at its
time and sets one to expire at most a lease TTL (24h at most) later.
Redis keeps them ascending. ]]

-- concurrencyEntry returns s.Expiries[i] (0-based), read from the set.
-- With s.newest still 0 it reads the latest, checked as an integer only;
-- once read, the latest is not asked again.
local function concurrencyEntry(s, i)
  if i == s.len - 1 and s.newest ~= 0 then
    return s.newest
  end
  local at = idx(i)
  local r = redisCall('ZRANGE', s.key, at, at, 'WITHSCORES')
  if i == s.len - 1 then
    s.latest = r[1] -- the lease that expires last, for concurrencyFind
  end
  local v, newest = int(r[2]), s.newest
  if v == nil or v < 1 then
    corrupt(s.key, 'score of lease ' .. i .. ' = ' .. string.sub(tostring(r[2]), 1, 40) .. ': want an integer > 0')
  elseif newest ~= 0 and v <= newest - MAX_LEASE_TTL then
    corrupt(s.key, 'score of lease ' .. i .. ' = ' .. r[2] .. ': want one after the latest, ' .. fmt(newest) .. ', less 24h')
  end
  return v
end

-- concurrencyNewest ports Concurrency.Newest: read once, with the length.
local function concurrencyNewest(s)
  return s.newest
end

-- concurrencyFind ports Concurrency.find. An absent state has no key to
-- ask, and holds no lease; the lease read with the length (s.latest, the
-- last in the set's order) needs no asking either, nor, when it is the
-- only one, any other.
local function concurrencyFind(s, id)
  if s.len == 0 then
    return -1
  elseif s.latest == id then
    return s.len - 1
  elseif s.len == 1 and s.latest ~= '' then
    return -1
  end
  return redisCall('ZRANK', s.key, id) or -1
end

-- concurrencyCut ports Concurrency.cut.
local function concurrencyCut(s, now)
  local lo, hi = 0, s.len
  while lo < hi do
    local mid = quo(lo + hi, 2)
    if concurrencyEntry(s, mid) <= now then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

-- concurrencyLive ports Concurrency.live.
local function concurrencyLive(s, id, now)
  local i = concurrencyFind(s, id)
  if i < 0 or concurrencyEntry(s, i) <= now then
    return -1
  end
  return i
end

local concurrencyRenew -- below: Decide and Renew call each other

-- concurrencyDecide ports Concurrency.Decide.
local function concurrencyDecide(s, p, now, cost, id)
  local limit = p.limit - p.reserve -- the ceiling: Params.ceiling
  local cut = concurrencyCut(s, now)
  local count = s.len - cut
  if cost > 0 and concurrencyLive(s, id, now) >= 0 then
    return concurrencyRenew(s, p, now, id)
  end
  if count + 1 > limit then
    -- The lease whose expiry frees a slot: the (count+1-Limit)-th soonest.
    local retryAfter = concurrencyEntry(s, cut + count - limit) - now
    -- count > Limit after a limit was lowered: remaining 0.
    local newest = concurrencyNewest(s)
    return {cut = 0, remove = '', add = '', at = 0, newest = newest}, false, mathMax(limit - count, 0),
      newest - now, retryAfter
  end
  local e = {cut = cut, remove = '', add = '', at = 0, newest = 0}
  if count > 0 then
    e.newest = concurrencyNewest(s)
  end
  local held = count
  if cost > 0 then
    e.add, e.at, e.newest = id, now + p.window, now + p.window
    held = held + 1
  end
  local resetAfter = 0
  if e.newest ~= 0 then
    resetAfter = e.newest - now
  end
  return e, true, limit - held, resetAfter, 0
end

-- concurrencyRenew ports Concurrency.Renew.
concurrencyRenew = function(s, p, now, id)
  if concurrencyLive(s, id, now) < 0 then
    return concurrencyDecide(s, p, now, 1, id)
  end
  local cut = concurrencyCut(s, now)
  local count = s.len - cut
  local e = {cut = cut, remove = '', add = id, at = now + p.window, newest = mathMax(concurrencyNewest(s), now + p.window)}
  return e, true, mathMax(p.limit - p.reserve - count, 0), e.newest - now, 0
end

-- concurrencyRelease ports Concurrency.Release.
local function concurrencyRelease(s, p, now, id)
  local n = s.len
  local cut = concurrencyCut(s, now)
  local count = n - cut
  local e = {cut = cut, remove = '', add = '', at = 0, newest = 0}
  local i = concurrencyLive(s, id, now)
  local left = count
  if i >= 0 then
    e.remove = id
    left = left - 1
  end
  if left > 0 then
    e.newest = concurrencyNewest(s)
    if i == n - 1 then -- the newest is the one released
      e.newest = concurrencyEntry(s, n - 2)
    end
  end
  local resetAfter = 0
  if e.newest ~= 0 then
    resetAfter = e.newest - now
  end
  return e, true, mathMax(p.limit - left, 0), resetAfter, 0
end

-- concurrencyExpires ports Concurrency.Expires.
local function concurrencyExpires(s)
  return concurrencyNewest(s)
end
