--[[ records.lua: the keys of a decision read into the engine's states and
its writes kept, with their TTLs: the I/O beside the engine. Go twin:
internal/engine/algorithm/engine.go, whose Policy.corrupt (fixedCorrupt,
decodeChecked, readState), Policy.bounds (px) and State.Apply (apply,
applyFixed) these read and write through, as memstore/memstore.go's
Store.put keeps a state in memory.

State of a concurrency policy: a sorted set of its leases, member the
lease id, score its expiry in µs; expired leases are swept by the call
that next writes it, and its TTL follows the latest expiry.
State: a fixed-size algorithm's fields as one string (SET … PX; its form
is in codec.lua), the sliding log as a list of admission times in µs.
Time source: LAYOUT.ARGV_NOW or Redis TIME, never both. Every written key gets
PX = ceil((expiry of its state - now + grace) / 1000) ms, now being the
time of this call, so a key never vanishes before its state equals absent;
but a fixed window on Redis time (KIND_FIXED_WINDOW_END: its end and
count) gets PXAT = its end rounded up to the ms, with no grace (short.lua's
fixedWindowFloor sets it when a window opens, and keeps it while the
window goes on: SETRANGE writes the count alone). ]]

-- fixedCorrupt returns why a to e, the fields of a state of fixed-size
-- kind, are none the algorithm can have written (fixedWindowCorrupt, …),
-- or nil.
-- fixedCorrupt ports the part of Policy.corrupt for the fixed-size kinds.
local function fixedCorrupt(kind, a, b, c, d, e, now)
  if kind == KIND_GCRA then
    return gcraCorrupt(a, b, c, d, e)
  elseif kind == KIND_FIXED_WINDOW then
    return fixedWindowCorrupt(a, b, c)
  elseif kind == KIND_TOKEN_BUCKET then
    return tokenBucketCorrupt(a, b, c)
  elseif kind == KIND_FIXED_WINDOW_END then
    return fixedWindowEndCorrupt(a, b, now)
  elseif kind == KIND_FIXED_PERIOD then
    return fixedPeriodCorrupt(a, b, c)
  end
  return slidingWindowCorrupt(a, b, c, d)
end

-- decodeChecked returns the fields of a state of fixed-size kind stored
-- at key as raw, as values: decoded (codec.lua), then held to what the
-- algorithm can have written, read at now.
local function decodeChecked(key, raw, kind, now)
  local a, b, c, d, e = decodeFields(key, raw, FIELDS[kind])
  local why = fixedCorrupt(kind, a, b, c, d, e, now)
  if why ~= nil then
    corrupt(key, why)
  end
  return a, b, c, d, e
end

-- The most entries a log or a set of leases holds: a write keeps at most
-- its policy's limit.
local MOST_ENTRIES = {[KIND_SLIDING_LOG] = MAX_SLIDING_LOG_LEN, [KIND_CONCURRENCY] = MAX_CONCURRENCY_LIMIT}

-- ahead raises SLUICE_CORRUPT when newest, the newest write to a state
-- of p at key (what, when not nil, says whose), lies further after now,
-- the time of a call on Redis time, than p's window and TTL grace. Redis's
-- clock may step back (NTP, a failover to a replica whose clock is
-- behind): a write up to that far ahead is decided at its own time (the
-- clock rule), its waits lengthened by as much. Further ahead, every wait
-- would be lengthened by more than the window it limits: corrupt, rather
-- than a subject locked out for longer than its policy ever could. (A
-- caller's clock has MaxClockRegression for this.) The one place of the
-- rule: readState, carryOver and fastMain's values call it.
local function ahead(key, p, newest, now, what)
  if newest - now > p.window + p.grace then
    corrupt(key, (what or '') .. 'newest write is ' .. fmt(newest - now) .. ' µs after the time of this call')
  end
end

-- readState returns the state of p at key, or nil when there is none, for
-- a call at now (on Redis time when onRedis is set). Anything but what
-- apply writes is corrupt: its fields are checked here, a log's or a
-- set's entries as a decision reads them (slidingLogCorrupt,
-- concurrency.lua), and on Redis time how far its newest write lies ahead
-- (ahead).
-- readState ports Policy.corrupt, with the key's read and the stored form's checks.
local function readState(key, p, now, onRedis)
  local kind = p.kind
  if kind == KIND_SLIDING_LOG or kind == KIND_CONCURRENCY then
    -- A view of the list (sorted set), its newest entry read with its length.
    local length, entry = 'LLEN', slidingLogEntry
    if kind == KIND_CONCURRENCY then
      length, entry = 'ZCARD', concurrencyEntry
    end
    local len = read(key, length)
    if len == 0 then
      return nil
    elseif len > MOST_ENTRIES[kind] then
      corrupt(key, 'holds ' .. len .. ' entries: want at most ' .. MOST_ENTRIES[kind])
    end
    local view = {key = key, len = len, newest = 0, oldest = 0, latest = ''}
    if kind == KIND_SLIDING_LOG then
      slidingLogCorrupt(view, p, now) -- reads the newest too
    else
      view.newest = entry(view, len - 1)
    end
    if onRedis then
      local _, newest = bounds(p, view)
      ahead(key, p, newest, now)
    end
    return view
  end
  local raw = read(key, 'GET')
  if not raw then
    return nil
  end
  local a, b, c, d, e = decodeChecked(key, raw, kind, now)
  if onRedis then
    local _, newest = boundsFixed(kind, p, a, b, c, d, e)
    ahead(key, p, newest, now)
  end
  return {a, b, c, d, e}
end

-- px returns the TTL, in ms, of a key whose state equals absent from
-- expires on, written at now with grace: until expires plus grace,
-- rounded up.
local function px(expires, now, grace)
  return fmt(mathMax(ceilDiv(expires - now + grace, 1000), 1))
end

-- applyFixed keeps the n fields a to e of a state of kind that expires
-- at expires at key, as apply does. A fixed window on Redis time
-- (KIND_FIXED_WINDOW_END) takes no grace: its key expires at its end,
-- rounded up to the millisecond (PXAT, Redis >= 6.2).
-- applyFixed ports the part of State.Apply for the fixed-size kinds, with the key's TTL.
local function applyFixed(key, kind, n, expires, now, grace, a, b, c, d, e)
  if expires <= now then
    redisCall('DEL', key)
  elseif kind == KIND_FIXED_WINDOW_END then
    redisCall('SET', key, encodeFields(n, a, b, c, d, e), 'PXAT', fmt(ceilDiv(expires, 1000)))
  else
    redisCall('SET', key, encodeFields(n, a, b, c, d, e), 'PX', px(expires, now, grace))
  end
end

-- apply keeps the state w describes at key and sets its TTL; a state that
-- equals absent is deleted. stored tells whether the key held a state.
-- apply ports State.Apply, on the key, with its TTL.
local function apply(key, kind, w, stored, now, grace)
  if w.expires <= now then
    redisCall('DEL', key)
    return
  end
  local ttl = px(w.expires, now, grace)
  if kind == KIND_CONCURRENCY then
    local e = w.leases
    if w.fresh and stored then
      redisCall('DEL', key)
    elseif e.cut > 0 then
      redisCall('ZREMRANGEBYRANK', key, '0', idx(e.cut - 1))
    end
    if e.remove ~= '' then
      redisCall('ZREM', key, e.remove)
    end
    if e.add ~= '' then
      redisCall('ZADD', key, fmt(e.at), e.add)
    end
    redisCall('PEXPIRE', key, ttl)
    return
  end
  if kind ~= KIND_SLIDING_LOG then
    local v = w.v
    applyFixed(key, kind, FIELDS[kind], w.expires, now, grace, v[1], v[2], v[3], v[4], v[5])
    return
  end
  local e = w.log
  if w.fresh and stored then
    redisCall('DEL', key)
  elseif e.cut > 0 or e.drop > 0 then
    redisCall('LTRIM', key, idx(e.cut), idx(-1 - e.drop))
  end
  local at, left = fmt(e.at), e.add
  while left > 0 do
    local batch = {}
    for j = 1, mathMin(left, 1000) do
      batch[j] = at
    end
    redisCall('RPUSH', key, unpack(batch))
    left = left - #batch
  end
  redisCall('PEXPIRE', key, ttl)
end
