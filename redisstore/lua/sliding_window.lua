--[[ sliding_window.lua ports internal/engine/algorithm/sliding_window.go. A
state is its fields as separate values (start, curr, prev, last), as
slidingWindowOf reads them; Decide returns the state after it, then the
decision's allowed, remaining, resetAfter and retryAfter (its limit is
p.limit). slidingWindowCorrupt ports SlidingWindow.corrupt
(the engine holds memstore's states to it too). ]]

-- slidingWindowCorrupt ports SlidingWindow.corrupt: it returns why start, curr, prev and last are no
-- state slidingWindowDecide writes, or nil. It writes only an admitted
-- spend, so curr >= 1; both counts are at most the limit at a write; the
-- newest write lies in the current window, start <= last < start +
-- window (start is 0 only for a write before the first window ended).
-- The window and limit of that write may have been others than today's,
-- so the bounds are the widest any policy has.
local function slidingWindowCorrupt(start, curr, prev, last)
  if curr < 1 or curr > MAX_LIMIT or prev > MAX_LIMIT then
    return 'counts ' .. fmt(curr) .. ', ' .. fmt(prev) .. ': want 1 to ' .. fmt(MAX_LIMIT) .. ' in this window, at most that in the last'
  elseif last < 1 or start < 0 or last < start or last - start >= MAX_WINDOW then
    return 'start ' .. fmt(start) .. ', last write ' .. fmt(last) .. ': want start <= last < start + 365 days'
  end
  return nil
end

-- slidingWindowAdvance ports SlidingWindow.advance.
local function slidingWindowAdvance(start, curr, prev, last, p, now)
  local window = p.window
  local w = now - rem(now, window)
  if w <= start then
    return start, curr, prev, last
  elseif w == start + window then
    return w, 0, curr, last
  end
  return w, 0, 0, last
end

-- slidingWindowResetAfter ports SlidingWindow.resetAfter.
local function slidingWindowResetAfter(curr, prev, p, elapsed)
  if curr > 0 then
    return 2 * p.window - elapsed
  elseif prev > 0 then
    return p.window - elapsed
  end
  return 0
end

-- slidingWindowDecide ports SlidingWindow.Decide.
local function slidingWindowDecide(start, curr, prev, last, p, now, cost)
  start, curr, prev, last = slidingWindowAdvance(start, curr, prev, last, p, now)
  local window, limit = p.window, p.limit - p.reserve -- the ceiling: Params.ceiling
  local elapsed = now - start
  -- All quantities below are scaled by Window.
  local weighted = prev * (window - elapsed) + curr * window
  local capacity = limit * window
  local need = verdictCost(cost)
  -- weighted + need*window may pass 2^53 and round, but only when it is far
  -- above capacity (< 2^53), so the comparison stays exact.
  if weighted + need * window > capacity then
    local retryAfter
    if curr + need <= limit then
      -- Wait for the previous window's share to decay enough.
      local at = window - quo((limit - curr - need) * window, prev)
      retryAfter = at - elapsed
    else
      -- Wait for the next window, where Curr becomes Prev.
      local at = window - quo((limit - need) * window, curr)
      retryAfter = window - elapsed + at
    end
    -- Above capacity after a limit was lowered: remaining 0.
    return start, curr, prev, last, false, quo(mathMax(capacity - weighted, 0), window),
      slidingWindowResetAfter(curr, prev, p, elapsed), retryAfter
  end
  if cost > 0 then
    curr, last = curr + cost, now
    weighted = weighted + cost * window
  end
  return start, curr, prev, last, true, quo(capacity - weighted, window),
    slidingWindowResetAfter(curr, prev, p, elapsed), 0
end

-- slidingWindowExpires ports SlidingWindow.Expires.
local function slidingWindowExpires(start, curr, prev, p)
  if curr > 0 then
    return start + 2 * p.window
  elseif prev > 0 then
    return start + p.window
  end
  return 0
end

-- slidingWindowNewest ports SlidingWindow.Newest.
local function slidingWindowNewest(last)
  return last
end
