--[[ gcra.lua ports internal/algorithm/gcra.go. The state is a table
{tat, frac, limit, window, last}. ]]

-- gcraOf ports gcraOf.
local function gcraOf(v)
  return {tat = v[1], frac = v[2], limit = v[3], window = v[4], last = v[5]}
end

-- gcraFields ports GCRA.fields.
local function gcraFields(s)
  return {s.tat, s.frac, s.limit, s.window, s.last}
end

-- gcraScheduledUnder ports GCRA.scheduledUnder.
local function gcraScheduledUnder(s, p)
  return (s.limit == p.limit and s.window == p.window) or s.tat == 0 or s.limit == 0 or s.window == 0
end

-- gcraReschedule ports GCRA.reschedule.
local function gcraReschedule(s, p)
  local units = 0 -- nothing outstanding when the TAT is not after Last (a refund moved it)
  local ahead = s.tat - s.last
  if ahead > quo(MAX_EXACT - 1 - s.frac, s.limit) then
    units = p.burst -- scheduled absurdly far ahead: as many as fit
  elseif ahead >= 0 then
    units = math.min(ceilDiv(ahead * s.limit + s.frac, s.window), p.burst)
  end
  local debt = units * p.window
  return {tat = s.last + quo(debt, p.limit), frac = rem(debt, p.limit), limit = p.limit, window = p.window, last = s.last}
end

-- gcraDecide ports GCRA.Decide.
local function gcraDecide(s, p, now, cost)
  local stored = s
  if not gcraScheduledUnder(s, p) then
    s = gcraReschedule(s, p)
  end
  local tau = p.burst * p.window -- Burst·T, scaled by Limit
  local need = verdictCost(cost) * p.window
  local d = decision(p.burst)
  -- debt is (TAT − now) scaled by Limit, or 0 when the TAT is past.
  local debt = 0
  local ahead = s.tat - now
  if s.tat ~= 0 and ahead >= 0 then
    if ahead > quo(tau, p.limit) + 1 then
      -- Further ahead than any admissible debt; keeps ahead × Limit
      -- from overflowing.
      d.retryAfter = ahead - floorDiv(tau - need - s.frac, p.limit)
      d.resetAfter = ahead + ceilDiv(s.frac, p.limit)
      return stored, d
    end
    debt = ahead * p.limit + s.frac
  end
  if debt + need > tau then
    d.remaining = quo(math.max(tau - debt, 0), p.window)
    d.retryAfter = ceilDiv(debt + need - tau, p.limit)
    d.resetAfter = ceilDiv(debt, p.limit)
    return stored, d
  end
  s = stored
  if cost > 0 then
    debt = debt + cost * p.window
    s = {tat = now + quo(debt, p.limit), frac = rem(debt, p.limit), limit = p.limit, window = p.window, last = now}
  end
  d.allowed = true
  d.remaining = quo(tau - debt, p.window)
  d.resetAfter = ceilDiv(debt, p.limit)
  return s, d
end

-- gcraExpires ports GCRA.Expires.
local function gcraExpires(s, p)
  if not gcraScheduledUnder(s, p) then
    s = gcraReschedule(s, p)
  end
  if s.tat == 0 then
    return 0
  end
  return s.tat + math.min(s.frac, 1) -- a remainder rounds up
end

-- gcraRefund ports GCRA.Refund.
local function gcraRefund(s, p, now, n)
  if not gcraScheduledUnder(s, p) then
    s = gcraReschedule(s, p)
  end
  if s.tat ~= 0 then
    s = {tat = s.tat, frac = s.frac, limit = s.limit, window = s.window, last = now}
    local back = n * p.window -- n·T scaled by Limit, below 2^53 since n <= Burst
    s.tat = s.tat - quo(back, p.limit)
    s.frac = s.frac - rem(back, p.limit)
    if s.frac < 0 then
      s.frac = s.frac + p.limit
      s.tat = s.tat - 1
    end
    if gcraExpires(s, p) <= now then
      s = {tat = 0, frac = 0, limit = 0, window = 0, last = 0} -- no debt left: absent, as a store drops it
    end
  end
  local _, d = gcraDecide(s, p, now, 0)
  d.allowed, d.retryAfter = true, 0
  return s, d
end

-- gcraNewest ports GCRA.Newest.
local function gcraNewest(s)
  return s.last
end
