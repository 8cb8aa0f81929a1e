--[[ sliding_log.lua ports internal/engine/algorithm/sliding_log.go. The log is
a Redis list of admission times in µs, ascending; a state here is a view
of it, {key, len, newest}, and s.Entries[i] of the Go code is
slidingLogEntry(s, i), one LINDEX. An edit is a table
{cut, drop, add, at, newest}; a decision is the values allowed,
remaining, resetAfter and retryAfter (its limit is p.limit).

Every entry read is checked against what the script writes
(slidingLogCorrupt ports SlidingLog.corrupt; the entries a decision
reads beyond it are checked as they are read): an integer >= 1 within
(newest − 365 days, newest], since a write cuts what left the window at its
time and appends at that time; and ascending, as far as the entries a
decision reads can tell: each one the cut's binary search reads lies
between those it read on either side, and each one a decision reads
from the live part lies after now − window. A disorder between the
entries read goes unseen, and harms nothing: an entry counted or cut
wrongly is cut by the next write with the rest. ]]

-- slidingLogChecked returns raw, entry i (0-based) as read from the
-- list, checked: an integer >= 1, and once s.newest is read, within
-- (newest − 365 days, newest].
local function slidingLogChecked(s, i, raw)
  local v, newest = int(raw), s.newest
  if v == nil or v < 1 then
    corrupt(s.key, 'entry ' .. i .. ' = ' .. string.sub(tostring(raw), 1, 40) .. ': want an integer > 0')
  elseif newest ~= 0 and (v > newest or v <= newest - MAX_WINDOW) then
    corrupt(s.key, 'entry ' .. i .. ' = ' .. raw .. ': want one in (newest - 365 days, newest], newest ' .. fmt(newest))
  end
  return v
end

-- slidingLogEntry returns s.Entries[i] (0-based), read from the list
-- and checked (slidingLogChecked); the newest and the oldest, once read,
-- are not asked again.
local function slidingLogEntry(s, i)
  if i == s.len - 1 and s.newest ~= 0 then
    return s.newest
  elseif i == 0 and s.oldest ~= 0 then
    return s.oldest
  end
  return slidingLogChecked(s, i, redisCall('LINDEX', s.key, idx(i)))
end

-- slidingLogCorrupt ports SlidingLog.corrupt on a view of a log of
-- s.len >= 1 entries, reading its newest entry into it as it goes: the
-- newest and the one before it in one LRANGE, the oldest (kept in the
-- view, as slidingLogCut reads it first), each checked by
-- slidingLogChecked, and a log that has ended at now by its newest
-- entry, about to be dropped whole, read whole: ascending. It returns
-- nothing; it raises SLUICE_CORRUPT.
local function slidingLogCorrupt(s, p, now)
  if s.len == 1 then
    s.newest = slidingLogEntry(s, 0)
    return
  end
  local two = redisCall('LRANGE', s.key, '-2', '-1')
  s.newest = slidingLogChecked(s, s.len - 1, two[2])
  local before = slidingLogChecked(s, s.len - 2, two[1])
  if s.len == 2 then
    s.oldest = before
  else
    s.oldest = slidingLogEntry(s, 0)
  end
  if s.newest + p.window <= now then
    local prev = 0
    for i, raw in ipairs(redisCall('LRANGE', s.key, '0', '-1')) do
      local v = int(raw)
      if v == nil or v < prev then
        corrupt(s.key, 'entries are not ascending: entry ' .. (i - 1) .. ' = ' .. string.sub(tostring(raw), 1, 40) .. ' lies before entry ' .. (i - 2) .. ' = ' .. fmt(prev))
      end
      prev = v
    end
  end
end

-- slidingLogLive returns entry i, which lies at or after the cut at now:
-- after now − p.window in an ascending log.
local function slidingLogLive(s, i, p, now)
  local v = slidingLogEntry(s, i)
  if v <= now - p.window then
    corrupt(s.key, 'entries are not ascending: entry ' .. i .. ' = ' .. fmt(v) .. ' lies before the live ones')
  end
  return v
end

-- slidingLogNewest ports SlidingLog.Newest: read once, with the length.
local function slidingLogNewest(s)
  return s.newest
end

-- slidingLogCut ports SlidingLog.cut. lov and hiv are the entries at
-- lo − 1 and hi (hi = len: the newest), which bound every one between.
local function slidingLogCut(s, p, now)
  local lo, hi = 0, s.len
  if hi == 0 then
    return 0
  end
  local lov, hiv = slidingLogEntry(s, 0), s.newest
  if lov > now - p.window then
    return 0
  end
  lo = 1
  while lo < hi do
    local mid = quo(lo + hi, 2)
    local v = slidingLogEntry(s, mid)
    if v < lov or v > hiv then
      corrupt(s.key, 'entries are not ascending: entry ' .. mid .. ' = ' .. fmt(v) .. ' lies outside [' .. fmt(lov) .. ', ' .. fmt(hiv) .. ']')
    end
    if v <= now - p.window then
      lo, lov = mid + 1, v
    else
      hi, hiv = mid, v
    end
  end
  return lo
end

-- slidingLogDecide ports SlidingLog.Decide: the edit, then the
-- decision's allowed, remaining, resetAfter and retryAfter (its limit is
-- p.limit).
local function slidingLogDecide(s, p, now, cost)
  local limit, window = p.limit - p.reserve, p.window -- the ceiling: Params.ceiling
  local cut = slidingLogCut(s, p, now)
  local count = s.len - cut
  local need = verdictCost(cost)
  if count + need > limit then
    -- The entry whose expiry frees enough room: the (count+need-Limit)-th oldest.
    local retryAfter = slidingLogLive(s, cut + count + need - limit - 1, p, now) + window - now
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
    e.newest = slidingLogLive(s, cut + left - 1, p, now)
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
