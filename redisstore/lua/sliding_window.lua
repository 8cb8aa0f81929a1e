--[[ sliding_window.lua ports internal/algorithm/sliding_window.go. The
state is a table {start, curr, prev, last}. ]]

-- slidingWindowOf ports slidingWindowOf.
local function slidingWindowOf(v)
  return {start = v[1], curr = v[2], prev = v[3], last = v[4]}
end

-- slidingWindowFields ports SlidingWindow.fields.
local function slidingWindowFields(s)
  return {s.start, s.curr, s.prev, s.last}
end

-- slidingWindowAdvance ports SlidingWindow.advance.
local function slidingWindowAdvance(s, p, now)
  local w = now - rem(now, p.window)
  if w <= s.start then
    return s
  elseif w == s.start + p.window then
    return {start = w, curr = 0, prev = s.curr, last = s.last}
  end
  return {start = w, curr = 0, prev = 0, last = s.last}
end

-- slidingWindowResetAfter ports SlidingWindow.resetAfter.
local function slidingWindowResetAfter(s, p, elapsed)
  if s.curr > 0 then
    return 2 * p.window - elapsed
  elseif s.prev > 0 then
    return p.window - elapsed
  end
  return 0
end

-- slidingWindowDecide ports SlidingWindow.Decide.
local function slidingWindowDecide(s, p, now, cost)
  s = slidingWindowAdvance(s, p, now)
  local elapsed = now - s.start
  -- All quantities below are scaled by Window.
  local weighted = s.prev * (p.window - elapsed) + s.curr * p.window
  local capacity = p.limit * p.window
  local d = decision(p.limit)
  local need = verdictCost(cost)
  -- weighted + need*window may pass 2^53 and round, but only when it is far
  -- above capacity (< 2^53), so the comparison stays exact.
  if weighted + need * p.window > capacity then
    d.remaining = quo(math.max(capacity - weighted, 0), p.window) -- above capacity after a limit was lowered
    d.resetAfter = slidingWindowResetAfter(s, p, elapsed)
    if s.curr + need <= p.limit then
      -- Wait for the previous window's share to decay enough.
      local at = p.window - quo((p.limit - s.curr - need) * p.window, s.prev)
      d.retryAfter = at - elapsed
    else
      -- Wait for the next window, where Curr becomes Prev.
      local at = p.window - quo((p.limit - need) * p.window, s.curr)
      d.retryAfter = p.window - elapsed + at
    end
    return s, d
  end
  if cost > 0 then
    s = {start = s.start, curr = s.curr + cost, prev = s.prev, last = now}
    weighted = weighted + cost * p.window
  end
  d.allowed = true
  d.remaining = quo(capacity - weighted, p.window)
  d.resetAfter = slidingWindowResetAfter(s, p, elapsed)
  return s, d
end

-- slidingWindowExpires ports SlidingWindow.Expires.
local function slidingWindowExpires(s, p)
  if s.curr > 0 then
    return s.start + 2 * p.window
  elseif s.prev > 0 then
    return s.start + p.window
  end
  return 0
end

-- slidingWindowNewest ports SlidingWindow.Newest.
local function slidingWindowNewest(s)
  return s.last
end
