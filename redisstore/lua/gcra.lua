--[[ gcra.lua ports internal/engine/algorithm/gcra.go. A state is its fields as
separate values (tat, frac, sLimit, sWindow, last: the Go fields TAT,
Frac, Limit, Window, Last), as gcraOf reads them; Decide and Refund return
the state after them, then the decision's allowed, remaining, resetAfter
and retryAfter (its limit is p.burst). gcraCorrupt ports GCRA.corrupt
(the engine holds memstore's states to it too). ]]

-- gcraCorrupt ports GCRA.corrupt: it returns why tat, frac, sLimit, sWindow and last are no
-- state gcraDecide or gcraRefund leaves to keep, or nil. A kept schedule
-- was written at last >= 1 under a policy's limit and window, with a
-- remainder below that limit; it ends after last (one that does not
-- equals absent and is deleted); and its debt at last, (tat − last) ×
-- sLimit + frac, is at most that policy's burst × window: at most
-- 10^9 × sWindow and below 2^53 − sLimit. So the TAT lies at most
-- burst × emission interval after the newest write, whatever burst it
-- had (a burst changed under one revision is kept, not rescheduled).
local function gcraCorrupt(tat, frac, sLimit, sWindow, last)
  if last < 1 or sLimit < 1 or sLimit > MAX_LIMIT or sWindow < MIN_WINDOW or sWindow > MAX_WINDOW or frac >= sLimit then
    return 'last write ' .. fmt(last) .. ', limit ' .. fmt(sLimit) .. ', window ' .. fmt(sWindow) .. ', remainder ' ..
      fmt(frac) .. ': want a write time, a policy\'s limit and window, a remainder below the limit'
  end
  local ahead = tat - last
  if ahead < 0 or (ahead == 0 and frac == 0) or ahead > quo(mathMin(MAX_EXACT - 1 - sLimit, MAX_LIMIT * sWindow) - frac, sLimit) then
    return 'TAT ' .. fmt(tat) .. ' is ' .. fmt(ahead) .. ' µs after the last write: want after it by at most burst × ' ..
      fmt(sWindow) .. ' / ' .. fmt(sLimit) .. ' µs'
  end
  return nil
end

-- gcraScheduledUnder ports GCRA.scheduledUnder.
local function gcraScheduledUnder(tat, sLimit, sWindow, p)
  return (sLimit == p.limit and sWindow == p.window) or tat == 0 or sLimit == 0 or sWindow == 0
end

-- gcraReschedule ports GCRA.reschedule.
local function gcraReschedule(tat, frac, sLimit, sWindow, last, p)
  local units = 0 -- nothing outstanding when the TAT is not after Last (a refund moved it)
  local ahead = tat - last
  if ahead > quo(MAX_EXACT - 1 - frac, sLimit) then
    units = p.burst -- scheduled absurdly far ahead: as many as fit
  elseif ahead >= 0 then
    units = mathMin(ceilDiv(ahead * sLimit + frac, sWindow), p.burst)
  end
  local debt = units * p.window
  return last + quo(debt, p.limit), rem(debt, p.limit), p.limit, p.window, last
end

-- gcraDecide ports GCRA.Decide: hold > 0 (µs) is a held spend's.
local function gcraDecide(tat, frac, sLimit, sWindow, last, p, now, cost, hold)
  local t, f = tat, frac -- the schedule decided on; the stored one is kept on a denial
  if not gcraScheduledUnder(tat, sLimit, sWindow, p) then
    t, f = gcraReschedule(tat, frac, sLimit, sWindow, last, p)
  end
  local limit, window = p.limit, p.window
  local tau = (p.burst - p.reserve) * window -- Burst·T, scaled by Limit, less the Reserve kept for a more important class
  local need = verdictCost(cost) * window
  -- debt is (TAT − now) scaled by Limit, or 0 when the TAT is past.
  local debt = 0
  local ahead = t - now
  if t ~= 0 and ahead >= 0 then
    if ahead > quo(tau, limit) + 1 then
      -- Further ahead than any admissible debt; keeps ahead × Limit
      -- from overflowing.
      return tat, frac, sLimit, sWindow, last, false, 0,
        ahead + ceilDiv(f, limit), ahead - floorDiv(tau - need - f, limit)
    end
    debt = ahead * limit + f
  end
  if debt < hold * limit then
    debt = hold * limit -- a held spend's floor; hold × limit <= tau (compared, not math.max: no call)
  end
  -- debt > tau − need, not debt + need > tau: the sum can pass 2^53
  -- (a held spend's debt of hold·Limit beside a cost of Burst), where
  -- doubles round; the difference cannot (need <= tau).
  if debt > tau - need then
    return tat, frac, sLimit, sWindow, last, false, quo(mathMax(tau - debt, 0), window),
      ceilDiv(debt, limit), ceilDiv(debt - (tau - need), limit)
  end
  if cost > 0 then
    debt = debt + cost * window
    tat, frac, sLimit, sWindow, last = now + quo(debt, limit), rem(debt, limit), limit, window, now
  end
  return tat, frac, sLimit, sWindow, last, true, quo(tau - debt, window), ceilDiv(debt, limit), 0
end

-- gcraExpires ports GCRA.Expires.
local function gcraExpires(tat, frac, sLimit, sWindow, last, p)
  if not gcraScheduledUnder(tat, sLimit, sWindow, p) then
    tat, frac = gcraReschedule(tat, frac, sLimit, sWindow, last, p)
  end
  if tat == 0 then
    return 0
  end
  return tat + mathMin(frac, 1) -- a remainder rounds up
end

-- gcraRefund ports GCRA.Refund.
local function gcraRefund(tat, frac, sLimit, sWindow, last, p, now, n)
  if not gcraScheduledUnder(tat, sLimit, sWindow, p) then
    tat, frac, sLimit, sWindow, last = gcraReschedule(tat, frac, sLimit, sWindow, last, p)
  end
  if tat ~= 0 then
    last = now
    local back = n * p.window -- n·T scaled by Limit, below 2^53 since n <= Burst
    tat = tat - quo(back, p.limit)
    frac = frac - rem(back, p.limit)
    if frac < 0 then
      frac = frac + p.limit
      tat = tat - 1
    end
    if gcraExpires(tat, frac, sLimit, sWindow, last, p) <= now then
      tat, frac, sLimit, sWindow, last = 0, 0, 0, 0, 0 -- no debt left: absent, as a store drops it
    end
  end
  local _, _, _, _, _, _, remaining, resetAfter = gcraDecide(tat, frac, sLimit, sWindow, last, p, now, 0, 0)
  return tat, frac, sLimit, sWindow, last, true, remaining, resetAfter, 0
end

-- gcraNewest ports GCRA.Newest.
local function gcraNewest(last)
  return last
end

-- gcraBook ports GCRA.Book: a booking of cost that may wait up to
-- mostWait µs; then the delay after the decision's values.
local function gcraBook(tat, frac, sLimit, sWindow, last, p, now, cost, mostWait)
  local t, f = tat, frac
  if not gcraScheduledUnder(tat, sLimit, sWindow, p) then
    t, f = gcraReschedule(tat, frac, sLimit, sWindow, last, p)
  end
  local limit, window = p.limit, p.window
  local tau = (p.burst - p.reserve) * window -- less the Reserve kept for a more important class, as in gcraDecide
  local need = cost * window
  local debt = 0 -- (TAT − now) scaled by Limit, or 0 when the TAT is past; corrupt bounds it
  local ahead = t - now
  if t ~= 0 and ahead >= 0 then
    debt = ahead * limit + f
  end
  local delay = 0
  if debt > tau - need then
    local wait = ceilDiv(debt - (tau - need), limit)
    if wait > mostWait then
      return tat, frac, sLimit, sWindow, last, false, quo(mathMax(tau - debt, 0), window), ceilDiv(debt, limit), wait, 0
    end
    delay = wait
  end
  debt = debt + need
  return now + quo(debt, limit), rem(debt, limit), limit, window, now, true, quo(mathMax(tau - debt, 0), window), ceilDiv(debt, limit), 0, delay
end
