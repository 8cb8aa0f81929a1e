--[[ token_bucket.lua ports internal/engine/algorithm/token_bucket.go. A state is
its fields as separate values (tokens, last, window), as tokenBucketOf
reads them; Decide and Refund return the state after them, then the
decision's allowed, remaining, resetAfter and retryAfter (its limit is
p.burst). tokenBucketCorrupt ports TokenBucket.corrupt
(the engine holds memstore's states to it too). ]]

-- tokenBucketCorrupt ports TokenBucket.corrupt: it returns why tokens, last and window are no state
-- tokenBucketDecide or tokenBucketRefund leaves to keep, or nil: a kept
-- bucket was written at last >= 1 under a policy's window, and holds
-- less than that policy's full bucket, burst × window, which is at most
-- 10^9 × window and below 2^53 − 1, and more than 10^9 × window below
-- empty (a settle's debt, settle.lua).
local function tokenBucketCorrupt(tokens, last, window)
  if last < 1 or window < MIN_WINDOW or window > MAX_WINDOW then
    return 'last write ' .. fmt(last) .. ', window ' .. fmt(window) .. ': want a write time and a window of 1ms to 365 days'
  elseif tokens >= MAX_LIMIT * window or tokens > MAX_EXACT - 2 or (tokens < 0 and tokens <= -MAX_LIMIT * window) then
    return 'tokens ' .. fmt(tokens) .. ': want fewer than a full bucket under window ' .. fmt(window) .. ', and less debt than 10^9 tokens'
  end
  return nil
end

-- tokenBucketTokens ports TokenBucket.tokens.
local function tokenBucketTokens(tokens, window, p)
  if window ~= 0 and window ~= p.window then
    return mathMin(mathMax(quo(tokens, window), 0), p.burst) * p.window -- no debt carried across windows
  end
  return mathMin(tokens, p.burst * p.window)
end

-- tokenBucketLevel ports TokenBucket.level.
local function tokenBucketLevel(tokens, last, window, p, now)
  local full = p.burst * p.window
  if last == 0 then
    return full
  end
  tokens = tokenBucketTokens(tokens, window, p)
  -- Refill, capping the elapsed time first so elapsed × Limit cannot overflow.
  local elapsed = now - last
  if elapsed >= ceilDiv(full - tokens, p.limit) then
    return full
  end
  return tokens + elapsed * p.limit
end

-- tokenBucketDecide ports TokenBucket.Decide: hold > 0 (µs) is a held
-- spend's.
local function tokenBucketDecide(tokens, last, window, p, now, cost, hold)
  local full = p.burst * p.window
  local level = tokenBucketLevel(tokens, last, window, p, now)
  if level > full - hold * p.limit then
    level = full - hold * p.limit -- a held spend's cap; hold × limit <= full (compared, not math.min: no call)
  end
  -- The tokens kept back for a more important class count as missing.
  local need, reserved = verdictCost(cost) * p.window, p.reserve * p.window
  if level - reserved < need then
    local remaining = 0 -- below empty after a settle's debt
    if level - reserved > 0 then
      remaining = quo(level - reserved, p.window)
    end
    return tokens, last, window, false, remaining, ceilDiv(full - level, p.limit), ceilDiv(need - (level - reserved), p.limit)
  end
  if cost > 0 then
    level = level - cost * p.window
    tokens, last, window = level, now, p.window
  end
  return tokens, last, window, true, quo(level - reserved, p.window), ceilDiv(full - level, p.limit), 0
end

-- tokenBucketExpires ports TokenBucket.Expires.
local function tokenBucketExpires(tokens, last, window, p)
  if last == 0 then
    return 0
  end
  return last + ceilDiv(p.burst * p.window - tokenBucketTokens(tokens, window, p), p.limit)
end

-- tokenBucketRefund ports TokenBucket.Refund.
local function tokenBucketRefund(tokens, last, window, p, now, n)
  if last ~= 0 then
    local level = tokenBucketLevel(tokens, last, window, p, now)
    -- level + n*window may pass 2^53 and round, but only far above the
    -- full bucket (< 2^53), so the min stays exact.
    tokens, last, window = mathMin(level + n * p.window, p.burst * p.window), now, p.window
    if tokenBucketExpires(tokens, last, window, p) <= now then
      tokens, last, window = 0, 0, 0 -- full: absent, as a store drops it
    end
  end
  local _, _, _, _, remaining, resetAfter = tokenBucketDecide(tokens, last, window, p, now, 0, 0)
  return tokens, last, window, true, remaining, resetAfter, 0
end

-- tokenBucketNewest ports TokenBucket.Newest.
local function tokenBucketNewest(last)
  return last
end

-- tokenBucketBook ports TokenBucket.Book: a booking of cost that may wait
-- up to mostWait µs; then the delay after the decision's values.
local function tokenBucketBook(tokens, last, window, p, now, cost, mostWait)
  local full = p.burst * p.window
  local level = tokenBucketLevel(tokens, last, window, p, now)
  local need, reserved = cost * p.window, p.reserve * p.window -- the Reserve kept for a more important class, as in tokenBucketDecide
  local delay = 0
  if level - reserved < need then
    local wait = ceilDiv(need - (level - reserved), p.limit)
    if wait > mostWait then
      return tokens, last, window, false, quo(mathMax(level - reserved, 0), p.window), ceilDiv(full - level, p.limit), wait, 0
    end
    delay = wait
  end
  level = level - need
  return level, now, p.window, true, quo(mathMax(level - reserved, 0), p.window), ceilDiv(full - level, p.limit), 0, delay
end
