--[[ fixed_period.lua ports internal/engine/algorithm/fixed_period.go: a fixed
window counting per calendar period. A state is its fields as separate
values (ends, count, last), as fixedPeriodOf reads them from State.V; the
periods are the policy's p.b0 to p.b3 (Params.Bounds), which the caller
computed around its own clock and args.lua's parsePolicy checked
(checkBounds). Decide and Refund return the state after them, then the
decision's allowed, remaining, resetAfter and retryAfter (its limit is
p.limit). ]]

-- fixedPeriodCorrupt ports FixedPeriod.corrupt: it returns why ends,
-- count and last are no state fixedPeriodDecide or fixedPeriodRefund
-- leaves to keep, or nil: 0 < last < ends <= last + 367 days.
local function fixedPeriodCorrupt(ends, count, last)
  if count < 1 or count > MAX_LIMIT then
    return 'count ' .. fmt(count) .. ': want 1 to ' .. fmt(MAX_LIMIT)
  elseif last < 1 or ends <= last or ends - last > MAX_PERIOD then
    return 'end ' .. fmt(ends) .. ', last write ' .. fmt(last) .. ': want 0 < last < end <= last + 367 days'
  end
  return nil
end

-- fixedPeriodEnd ports Params.periodEnd: the end of the period holding
-- t, or 0 when t lies outside all of them.
local function fixedPeriodEnd(p, t)
  if t < p.b0 or t >= p.b3 then
    return 0
  elseif t < p.b1 then
    return p.b1
  elseif t < p.b2 then
    return p.b2
  end
  return p.b3
end

-- fixedPeriodOutside ports Params.periodOutside: it raises SLUICE_CLOCK
-- (read as ClockUnsafe, as Go's *ClockError) when at, the time key's
-- policy p is decided at, lies outside its periods.
local function fixedPeriodOutside(key, p, at)
  if fixedPeriodEnd(p, at) == 0 then
    raise('SLUICE_CLOCK', key .. ': time ' .. fmt(at) .. ' lies outside the periods [' .. fmt(p.b0) .. ', ' .. fmt(p.b3) ..
      ') computed around the caller\'s clock')
  end
end

-- fixedPeriodDecide ports FixedPeriod.Decide.
local function fixedPeriodDecide(ends, count, last, p, now, cost)
  local limit = p.limit - p.reserve -- the ceiling: Params.ceiling
  if count == 0 or now >= ends then
    ends, count, last = fixedPeriodEnd(p, now), 0, 0
  end
  if count + verdictCost(cost) > limit then
    -- Count > Limit after a limit was lowered: remaining 0.
    return ends, count, last, false, mathMax(limit - count, 0), ends - now, ends - now
  end
  if cost > 0 then
    count, last = count + cost, now
  end
  local resetAfter = 0
  if count > 0 then
    resetAfter = ends - now
  end
  return ends, count, last, true, limit - count, resetAfter, 0
end

-- fixedPeriodExpires ports FixedPeriod.Expires.
local function fixedPeriodExpires(ends, count)
  if count == 0 then
    return 0
  end
  return ends
end

-- fixedPeriodRefund ports FixedPeriod.Refund.
local function fixedPeriodRefund(ends, count, last, p, now, n)
  if count ~= 0 and now < ends then
    count, last = mathMax(count - n, 0), now
  end
  if fixedPeriodExpires(ends, count) <= now then
    ends, count, last = 0, 0, 0 -- nothing left to remember: absent, as a store drops it
  end
  local _, _, _, _, remaining, resetAfter = fixedPeriodDecide(ends, count, last, p, now, 0)
  return ends, count, last, true, remaining, resetAfter, 0
end

-- fixedPeriodNewest ports FixedPeriod.Newest.
local function fixedPeriodNewest(last)
  return last
end
