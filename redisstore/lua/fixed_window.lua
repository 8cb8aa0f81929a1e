--[[ fixed_window.lua ports internal/engine/algorithm/fixed_window.go. A state is
its fields as separate values (start, count, last), as fixedWindowOf reads
them from State.V; Decide and Refund return the state after them, then
the decision's allowed, remaining, resetAfter and retryAfter (its limit is
p.limit). Values, not tables: a decision allocates nothing here.
FixedWindowEnd's state is its end and count, as fixedWindowEndOf reads
them. ]]

-- fixedWindowCorrupt ports FixedWindow.corrupt: it returns why start, count and last are no state
-- fixedWindowDecide or fixedWindowRefund leaves to keep, or nil. A kept
-- window holds a count (one of 0 equals absent and is deleted) of at most
-- the limit at its write, and its newest write lies in it:
-- start <= last < start + window. The window and limit of that write
-- may have been others than today's (numbers changed under one revision),
-- so the bounds are the widest any policy has.
local function fixedWindowCorrupt(start, count, last)
  if count < 1 or count > MAX_LIMIT then
    return 'count ' .. fmt(count) .. ': want 1 to ' .. fmt(MAX_LIMIT)
  elseif start < 1 or last < start or last - start >= MAX_WINDOW then
    return 'start ' .. fmt(start) .. ', last write ' .. fmt(last) .. ': want 0 < start <= last < start + 365 days'
  end
  return nil
end

-- fixedWindowStart ports Params.windowStart.
local function fixedWindowStart(p, now)
  if not p.aligned then
    return now
  end
  return mathMax(floorDiv(now, p.window) * p.window, 1)
end

-- fixedWindowDecide ports FixedWindow.Decide.
local function fixedWindowDecide(start, count, last, p, now, cost)
  local window, limit = p.window, p.limit - p.reserve -- the ceiling: Params.ceiling
  if start == 0 or now >= start + window then
    start, count, last = fixedWindowStart(p, now), 0, 0
  end
  if count + verdictCost(cost) > limit then
    local resetAfter = start + window - now
    -- Count > Limit after a limit was lowered: remaining 0.
    return start, count, last, false, mathMax(limit - count, 0), resetAfter, resetAfter
  end
  if cost > 0 then
    count, last = count + cost, now
  end
  local resetAfter = 0
  if count > 0 then
    resetAfter = start + window - now
  end
  return start, count, last, true, limit - count, resetAfter, 0
end

-- fixedWindowExpires ports FixedWindow.Expires.
local function fixedWindowExpires(start, count, p)
  if count == 0 then
    return 0
  end
  return start + p.window
end

-- fixedWindowRefund ports FixedWindow.Refund.
local function fixedWindowRefund(start, count, last, p, now, n)
  if start ~= 0 and now < start + p.window then
    count, last = mathMax(count - n, 0), now
  end
  if fixedWindowExpires(start, count, p) <= now then
    start, count, last = 0, 0, 0 -- nothing left to remember: absent, as a store drops it
  end
  local _, _, _, _, remaining, resetAfter = fixedWindowDecide(start, count, last, p, now, 0)
  return start, count, last, true, remaining, resetAfter, 0
end

-- fixedWindowNewest ports FixedWindow.Newest.
local function fixedWindowNewest(last)
  return last
end

-- fixedWindowEndCorrupt ports FixedWindowEnd.corrupt.
local function fixedWindowEndCorrupt(ends, count, now)
  if count < 1 or count > MAX_LIMIT then
    return 'count ' .. fmt(count) .. ': want 1 to ' .. fmt(MAX_LIMIT)
  elseif ends < 1 then
    return 'end ' .. fmt(ends) .. ': want a time after the epoch'
  elseif ends - now > MAX_WINDOW then
    return 'end is ' .. fmt(ends - now) .. ' µs after the time of this call: want at most 365 days'
  end
  return nil
end

-- fixedWindowEndDecide ports FixedWindowEnd.Decide.
local function fixedWindowEndDecide(ends, count, p, now, cost)
  local limit = p.limit - p.reserve -- the ceiling: Params.ceiling
  if count == 0 or now >= ends then
    ends, count = fixedWindowStart(p, now) + p.window, 0
  end
  if count + verdictCost(cost) > limit then
    -- Count > Limit after a limit was lowered: remaining 0.
    return ends, count, false, mathMax(limit - count, 0), ends - now, ends - now
  end
  count = count + cost
  local resetAfter = 0
  if count > 0 then
    resetAfter = ends - now
  end
  return ends, count, true, limit - count, resetAfter, 0
end

-- fixedWindowEndExpires ports FixedWindowEnd.Expires.
local function fixedWindowEndExpires(ends, count)
  if count == 0 then
    return 0
  end
  return ends
end

-- fixedWindowEndRefund ports FixedWindowEnd.Refund.
local function fixedWindowEndRefund(ends, count, p, now, n)
  if count ~= 0 and now < ends then
    count = mathMax(count - n, 0)
  end
  if fixedWindowEndExpires(ends, count) <= now then
    ends, count = 0, 0 -- nothing left to remember: absent, as a store drops it
  end
  local _, _, _, remaining, resetAfter = fixedWindowEndDecide(ends, count, p, now, 0)
  return ends, count, true, remaining, resetAfter, 0
end

-- fixedWindowEndNewest ports FixedWindowEnd.Newest.
local function fixedWindowEndNewest()
  return 0
end
