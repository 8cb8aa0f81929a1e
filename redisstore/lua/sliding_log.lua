--[[ sliding_log.lua ports internal/algorithm/sliding_log.go. The log is
a Redis list of admission times in µs, ascending; a state here is a view
of it, {key, len, newest}, and s.Entries[i] of the Go code is
slidingLogEntry(s, i), one LINDEX. An edit is a table
{cut, drop, add, at, newest}; a decision is the values allowed,
remaining, resetAfter and retryAfter (its limit is p.limit). ]]

-- slidingLogEntry returns s.Entries[i] (0-based), read from the list.
local function slidingLogEntry(s, i)
  local raw = redisCall('LINDEX', s.key, i)
  local v = int(raw)
  if v == nil or v < 1 then
    corrupt(s.key, 'entry ' .. i .. ' = ' .. string.sub(tostring(raw), 1, 40) .. ': want an integer > 0')
  end
  return v
end

-- slidingLogNewest ports SlidingLog.Newest: read once, with the length.
local function slidingLogNewest(s)
  return s.newest
end

-- slidingLogCut ports SlidingLog.cut.
local function slidingLogCut(s, p, now)
  local lo, hi = 0, s.len
  if hi == 0 or slidingLogEntry(s, 0) > now - p.window then
    return 0
  end
  lo = 1
  while lo < hi do
    local mid = quo(lo + hi, 2)
    if slidingLogEntry(s, mid) <= now - p.window then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

-- slidingLogDecide ports SlidingLog.Decide: the edit, then the
-- decision's allowed, remaining, resetAfter and retryAfter (its limit is
-- p.limit).
local function slidingLogDecide(s, p, now, cost)
  local limit, window = p.limit, p.window
  local cut = slidingLogCut(s, p, now)
  local count = s.len - cut
  local need = verdictCost(cost)
  if count + need > limit then
    -- The entry whose expiry frees enough room: the (count+need-Limit)-th oldest.
    local retryAfter = slidingLogEntry(s, cut + count + need - limit - 1) + window - now
    -- count > Limit after a limit was lowered: remaining 0.
    local newest = slidingLogNewest(s)
    return {cut = 0, drop = 0, add = 0, at = 0, newest = newest}, false, mathMax(limit - count, 0),
      newest + window - now, retryAfter
  end
  local e = {cut = cut, drop = 0, add = 0, at = 0, newest = 0}
  if count > 0 then
    e.newest = slidingLogNewest(s)
  end
  if cost > 0 then
    e.add, e.at, e.newest = cost, now, now
  end
  local resetAfter = 0
  if e.newest ~= 0 then
    resetAfter = e.newest + window - now
  end
  return e, true, limit - count - cost, resetAfter, 0
end

-- slidingLogRefund ports SlidingLog.Refund.
local function slidingLogRefund(s, p, now, n)
  local cut = slidingLogCut(s, p, now)
  local count = s.len - cut
  local e = {cut = cut, drop = mathMin(n, count), add = 0, at = 0, newest = 0}
  local left = count - e.drop
  local resetAfter = 0
  if left > 0 then
    e.newest = slidingLogEntry(s, cut + left - 1)
    resetAfter = e.newest + p.window - now
  end
  return e, true, mathMax(p.limit - left, 0), resetAfter, 0
end

-- slidingLogExpires ports SlidingLog.Expires.
local function slidingLogExpires(s, p)
  if s.len == 0 then
    return 0
  end
  return slidingLogNewest(s) + p.window
end
