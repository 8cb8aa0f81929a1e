--[[ token_bucket.lua ports internal/algorithm/token_bucket.go. The state
is a table {tokens, last, window}. ]]

-- tokenBucketOf ports tokenBucketOf.
local function tokenBucketOf(v)
  return {tokens = v[1], last = v[2], window = v[3]}
end

-- tokenBucketFields ports TokenBucket.fields.
local function tokenBucketFields(s)
  return {s.tokens, s.last, s.window}
end

-- tokenBucketTokens ports TokenBucket.tokens.
local function tokenBucketTokens(s, p)
  if s.window ~= 0 and s.window ~= p.window then
    return math.min(quo(s.tokens, s.window), p.burst) * p.window
  end
  return math.min(s.tokens, p.burst * p.window)
end

-- tokenBucketLevel ports TokenBucket.level.
local function tokenBucketLevel(s, p, now)
  local full = p.burst * p.window
  if s.last == 0 then
    return full
  end
  local tokens = tokenBucketTokens(s, p)
  -- Refill, capping the elapsed time first so elapsed × Limit cannot overflow.
  local elapsed = now - s.last
  if elapsed >= ceilDiv(full - tokens, p.limit) then
    return full
  end
  return tokens + elapsed * p.limit
end

-- tokenBucketDecide ports TokenBucket.Decide.
local function tokenBucketDecide(s, p, now, cost)
  local full = p.burst * p.window
  local tokens = tokenBucketLevel(s, p, now)
  local d = decision(p.burst)
  local need = verdictCost(cost) * p.window
  if tokens < need then
    d.remaining = quo(tokens, p.window)
    d.retryAfter = ceilDiv(need - tokens, p.limit)
    d.resetAfter = ceilDiv(full - tokens, p.limit)
    return s, d
  end
  if cost > 0 then
    tokens = tokens - cost * p.window
    s = {tokens = tokens, last = now, window = p.window}
  end
  d.allowed = true
  d.remaining = quo(tokens, p.window)
  d.resetAfter = ceilDiv(full - tokens, p.limit)
  return s, d
end

-- tokenBucketExpires ports TokenBucket.Expires.
local function tokenBucketExpires(s, p)
  if s.last == 0 then
    return 0
  end
  return s.last + ceilDiv(p.burst * p.window - tokenBucketTokens(s, p), p.limit)
end

-- tokenBucketRefund ports TokenBucket.Refund.
local function tokenBucketRefund(s, p, now, n)
  if s.last ~= 0 then
    local tokens = tokenBucketLevel(s, p, now)
    -- tokens + n*window may pass 2^53 and round, but only far above the
    -- full bucket (< 2^53), so the min stays exact.
    s = {tokens = math.min(tokens + n * p.window, p.burst * p.window), last = now, window = p.window}
    if tokenBucketExpires(s, p) <= now then
      s = {tokens = 0, last = 0, window = 0} -- full: absent, as a store drops it
    end
  end
  local _, d = tokenBucketDecide(s, p, now, 0)
  d.allowed, d.retryAfter = true, 0
  return s, d
end

-- tokenBucketNewest ports TokenBucket.Newest.
local function tokenBucketNewest(s)
  return s.last
end
