--[[ fixed_window.lua ports internal/algorithm/fixed_window.go. The state
is a table {start, count, last}; the fields of a State are an array. ]]

-- fixedWindowOf ports fixedWindowOf.
local function fixedWindowOf(v)
  return {start = v[1], count = v[2], last = v[3]}
end

-- fixedWindowFields ports FixedWindow.fields.
local function fixedWindowFields(s)
  return {s.start, s.count, s.last}
end

-- fixedWindowDecide ports FixedWindow.Decide.
local function fixedWindowDecide(s, p, now, cost)
  if s.start == 0 or now >= s.start + p.window then
    s = {start = now, count = 0, last = 0}
  end
  local d = decision(p.limit)
  local need = verdictCost(cost)
  if s.count + need > p.limit then
    d.remaining = math.max(p.limit - s.count, 0) -- Count > Limit after a limit was lowered
    d.resetAfter = s.start + p.window - now
    d.retryAfter = d.resetAfter
    return s, d
  end
  if cost > 0 then
    s = {start = s.start, count = s.count + cost, last = now}
  end
  d.allowed = true
  d.remaining = p.limit - s.count
  if s.count > 0 then
    d.resetAfter = s.start + p.window - now
  end
  return s, d
end

-- fixedWindowExpires ports FixedWindow.Expires.
local function fixedWindowExpires(s, p)
  if s.count == 0 then
    return 0
  end
  return s.start + p.window
end

-- fixedWindowRefund ports FixedWindow.Refund.
local function fixedWindowRefund(s, p, now, n)
  if s.start ~= 0 and now < s.start + p.window then
    s = {start = s.start, count = math.max(s.count - n, 0), last = now}
  end
  if fixedWindowExpires(s, p) <= now then
    s = {start = 0, count = 0, last = 0} -- nothing left to remember: absent, as a store drops it
  end
  local _, d = fixedWindowDecide(s, p, now, 0)
  d.allowed, d.retryAfter = true, 0
  return s, d
end

-- fixedWindowNewest ports FixedWindow.Newest.
local function fixedWindowNewest(s)
  return s.last
end
