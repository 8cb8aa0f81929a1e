--[[ redisstore.lua: one sluice decision, atomically, for one subject and
one or more policies: either every policy admits the cost and it is spent
on all of them, or nothing is written. main ports the part of
redisstore.Store.Evaluate that runs in Redis, around the engine
(engine.lua ports internal/engine/algorithm/engine.go), as memstore.Store.Evaluate
does around the Go engine.

KEYS[1..n]  the state key of policy i: <prefix>{<subject>}<policy id>:<revision>:<algorithm code>.
         With an evaluation id, KEYS[n+1] is the sorted set of remembered ids
         (score: expiry in µs) and KEYS[n+2] the hash id -> remembered reply,
         both of the first policy. All keys of one call share the subject's
         hash tag (one Cluster slot).
ARGV, by the named positions below (redisstore.go names them alike):
  ARGV_COST            cost, an integer >= 0: the units a spend, refund or acquire takes.
  ARGV_NOW             now in µs since the Unix epoch (caller clock), or "" to
                       read the time with Redis TIME (one clock for every caller).
  ARGV_MAX_REGRESSION  caller clock only: the most, in µs, now may lie behind a
                       state's newest write; -1 means unbounded.
  ARGV_OP              the operation (algorithm.Op's name): "spend", "peek" (judged as
                       a spend of 1, writes nothing), "refund" (give cost units back),
                       "reset" (delete every policy's state, whatever it holds),
                       "acquire" (take the lease ARGV_LEASE on each concurrency policy,
                       spend cost on the others), "release" (give the lease back) or
                       "renew" (extend it). Its rules (which policies, what cost) are
                       checked by redisstore.go with algorithm.Check before the call;
                       this script checks only that the arguments are well-formed.
  ARGV_ID              the evaluation id, or "" (then KEYS holds no id keys).
  ARGV_DEDUPE_TTL      how long a decision for an id is remembered, µs.
  ARGV_DEDUPE_MAX      how many ids are remembered at most.
  ARGV_CARRY           a key rotation (sluice.Evaluation.Previous): "" (none), "probe"
                       (answer {REPLY_ABSENT}, deciding and writing nothing, when a
                       policy has no live state), or "carry": then CARRY_PER_POLICY
                       more arguments per policy follow the policies', the state
                       read under an older subject ("" for none; a fixed-size
                       state as stored, a log's entries joined by ',') and its
                       TTL in ms. A policy without a live state takes it, kept
                       at its key with that TTL whatever the verdict.
  ARGV_LEASE           the lease an acquire takes on each concurrency policy, or
                       the one a release or renewal names; "" for none.
  ARGV_HOLD            a held spend's hold in µs (sluice.Evaluation.Hold; its rules
                       are algorithm.Check's), an integer in [0, MAX_WINDOW]; 0 for
                       every other decision.
  then one argument per policy, from ARGV_POLICIES + 1: its algorithm
  (algorithm.Kind: on Redis time a fixed window is KindFixedWindowEnd,
  whose key expires at the window's end with no grace), limit, window in µs, burst, TTL grace in µs
  (CleanupGrace + ExtraTTL) and align (1: a fixed window on the clock's
  boundaries, Params.Aligned; else 0), in that order, as decimals joined
  by spaces, e.g. "5 100 1000000 20 0 0" (the same string for every decision of the
  policy, so it is parsed and checked once).

Reply: replayed (1 when the reply is the one remembered for the evaluation
id, else 0), then REPLY_PER_POLICY integers per policy, in KEYS order:
allowed (1 or 0), limit, remaining, reset_after (µs), retry_after (µs);
on Redis time, then the time the call decided at (µs), so that a reader
of the reply (the differential test) can decide it again.
Errors, raised before any write: "SLUICE_ARGS <reason>",
"SLUICE_CORRUPT <key>: <reason>" (state this script did not write: wrong
type, not its integers, or integers no decision of it leaves behind:
readState), "SLUICE_CLOCK <key>: <reason>" (caller clock too
far behind). An error Redis raises in a call (OOM, READONLY, …) aborts the
script with that error.

State of a concurrency policy: a sorted set of its leases, member the
lease id, score its expiry in µs; expired leases are swept by the call
that next writes it, and its TTL follows the latest expiry.
State: a fixed-size algorithm's fields as one string (SET … PX; its form
is in codec.lua), the sliding log as a list of admission times in µs.
Time source: ARGV_NOW or Redis TIME, never both. Every written key gets
PX = ceil((expiry of its state - now + grace) / 1000) ms, now being the
time of this call, so a key never vanishes before its state equals absent;
but a fixed window on Redis time (KIND_FIXED_WINDOW_END: its end and
count) gets PXAT = its end rounded up to the ms, with no grace.
Needs Redis >= 5 (effects replication of a script that calls TIME), and
6.2 for a fixed window on Redis time (SET … PXAT); on
Redis >= 7 it is loaded once as a function library (FUNCTION LOAD) and
called with FCALL, so its definitions are not rebuilt on every call. ]]

local ARGV_COST = 1
local ARGV_NOW = 2
local ARGV_MAX_REGRESSION = 3
local ARGV_OP = 4
local ARGV_ID = 5
local ARGV_DEDUPE_TTL = 6
local ARGV_DEDUPE_MAX = 7
local ARGV_CARRY = 8
local ARGV_LEASE = 9
local ARGV_HOLD = 10
local ARGV_POLICIES = 10
local ARGV_PER_POLICY = 1
local REPLY_PER_POLICY = 5
local CARRY_PER_POLICY = 2
local REPLY_ABSENT = 2
local MAX_GRACE = 90000000000 -- µs: CleanupGrace (1h) + ExtraTTL (24h)
local MAX_DEDUPE_TTL = 3600000000 -- µs
local MAX_DEDUPE_IDS = 10000
local OPS = {spend = true, peek = true, refund = true, reset = true, acquire = true, release = true, renew = true}

-- fixedCorrupt returns why a to e, the fields of a state of fixed-size
-- kind, are none the algorithm can have written (fixedWindowCorrupt, …),
-- or nil.
local function fixedCorrupt(kind, a, b, c, d, e, now)
  if kind == KIND_GCRA then
    return gcraCorrupt(a, b, c, d, e)
  elseif kind == KIND_FIXED_WINDOW then
    return fixedWindowCorrupt(a, b, c)
  elseif kind == KIND_TOKEN_BUCKET then
    return tokenBucketCorrupt(a, b, c)
  elseif kind == KIND_FIXED_WINDOW_END then
    return fixedWindowEndCorrupt(a, b, now)
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

------------------------------------------------------------------------
-- Evaluation ids: a sorted set (member: id, score: expiry in µs) and a hash
-- (id -> the reply's integers, comma-separated) per subject and first
-- policy, as memstore's dedupeLog.

-- dedupeLookup returns the decisions remembered for id (flat, as
-- evaluate keeps them: the replayed flag, here 1, first), or nil when
-- there are none or they expired (score <= now).
local function dedupeLookup(zkey, hkey, id, now)
  for _, key in ipairs({zkey, hkey}) do
    if redisCall('PTTL', key) == -1 then
      corrupt(key, 'has no TTL')
    end
  end
  local score = read(zkey, 'ZSCORE', id)
  if not score then
    return nil
  end
  local exp = int(score)
  if exp == nil then
    corrupt(zkey, 'score of an id = ' .. tostring(score) .. ': want an integer')
  end
  if exp <= now then
    return nil
  end
  local raw = read(hkey, 'HGET', id)
  if not raw then
    corrupt(hkey, 'holds no reply for a remembered id')
  end
  local vals = {1} -- the reply's replayed flag, then the decisions
  for x in string.gmatch(raw, '[^,]+') do
    local v = int(x)
    if v == nil then
      corrupt(hkey, 'a remembered reply holds ' .. string.sub(x, 1, 40) .. ': want integers')
    end
    vals[#vals + 1] = v
  end
  if (#vals - 1) % REPLY_PER_POLICY ~= 0 then
    corrupt(hkey, 'a remembered reply holds ' .. (#vals - 1) .. ' integers')
  end
  local why = recordCorrupt(vals)
  if why ~= nil then
    corrupt(hkey, 'a remembered reply: ' .. why)
  end
  return vals
end

-- hdel deletes fields from the hash at key, 1000 at a time: Lua's unpack
-- fails on a few thousand values, and up to 10000 ids may go at once.
local function hdel(key, fields)
  for i = 1, #fields, 1000 do
    redisCall('HDEL', key, unpack(fields, i, mathMin(i + 999, #fields)))
  end
end

-- dedupeRemember records reply for id until now + ttl, forgetting expired
-- ids and, beyond max, the oldest; the keys live until the newest record
-- expires, plus grace.
local function dedupeRemember(zkey, hkey, id, now, ttl, max, grace, reply)
  local expired = redisCall('ZRANGEBYSCORE', zkey, '-inf', fmt(now))
  if #expired > 0 then
    redisCall('ZREMRANGEBYSCORE', zkey, '-inf', fmt(now))
    hdel(hkey, expired)
  end
  local vals = {}
  for i = 2, #reply do
    vals[i - 1] = fmt(reply[i])
  end
  redisCall('HSET', hkey, id, table.concat(vals, ','))
  redisCall('ZADD', zkey, fmt(now + ttl), id)
  local over = redisCall('ZCARD', zkey) - max
  if over > 0 then
    local oldest = redisCall('ZRANGE', zkey, 0, over - 1)
    redisCall('ZREMRANGEBYRANK', zkey, 0, over - 1)
    hdel(hkey, oldest)
  end
  local ms = fmt(ceilDiv(ttl + grace, 1000))
  redisCall('PEXPIRE', zkey, ms)
  redisCall('PEXPIRE', hkey, ms)
end

------------------------------------------------------------------------

------------------------------------------------------------------------
-- Key rotation: state read under an older subject of the same caller.

-- live reports whether st, the state of policy p, is there and not yet
-- equal to absent at now.
local function live(p, st, now)
  return st ~= nil and bounds(p, st) > now
end

-- carriedEntries returns the entries of a log or of leases carried in
-- ARGV as raw (a log's times, or leases' id,expiry pairs as ZRANGE
-- WITHSCORES reads them, ascending) for key: as ZADD or RPUSH arguments,
-- and the newest. Everything a decision could read of them is checked
-- first, as readState and the entry readers would once they are kept:
-- at most MOST_ENTRIES, integers >= 1, ascending, within (newest − 24h,
-- newest].
local function carriedEntries(key, raw, kind)
  local out, member, prev, oldest = {}, nil, 0, nil
  local leases = kind == KIND_CONCURRENCY
  for x in string.gmatch(raw, '[^,]+') do
    if leases and member == nil then
      member = x
    else
      local v = int(x)
      if v == nil or v < prev or v < 1 then
        corrupt(key, 'carried entry ' .. string.sub(x, 1, 40) .. ': want ascending integers > 0')
      end
      out[#out + 1], prev, oldest = x, v, oldest or v
      if leases then
        out[#out + 1], member = member, nil
      end
    end
  end
  if member ~= nil then
    corrupt(key, 'carried leases: want id,expiry pairs')
  elseif #out > MOST_ENTRIES[kind] * (leases and 2 or 1) then
    corrupt(key, 'carried ' .. #out .. ' values: want at most ' .. MOST_ENTRIES[kind] .. ' entries')
  elseif oldest ~= nil and oldest <= prev - MAX_WINDOW then
    corrupt(key, 'carried entry ' .. fmt(oldest) .. ': want one in (newest - 24h, newest], newest ' .. fmt(prev))
  end
  return out, prev
end

-- carryOver gives each policy of ev without a live state the state
-- carried in ARGV, if any: checked first (anything the store would not
-- have written is corrupt), then kept at its key with its TTL.
local function carryOver(KEYS, ARGV, ev, now)
  local n = #ev.policies
  local take = {}
  for i, p in ipairs(ev.policies) do
    local base = ARGV_POLICIES + ARGV_PER_POLICY * n + CARRY_PER_POLICY * (i - 1)
    local raw, ttl = ARGV[base + 1], arg(ARGV[base + 2])
    if raw ~= '' and ttl ~= nil and ttl >= 1 and not live(p, ev.states[i], now) then
      local newest
      if p.kind == KIND_CONCURRENCY then
        local zadd, latest = carriedEntries(KEYS[i], raw, p.kind)
        take[i], newest = {leases = zadd, ttl = ttl}, latest - p.window
      elseif p.kind == KIND_SLIDING_LOG then
        local entries, latest = carriedEntries(KEYS[i], raw, p.kind)
        take[i], newest = {entries = entries, ttl = ttl}, latest
      else
        local a, b, c, d, e = decodeChecked(KEYS[i], raw, p.kind, now)
        local v = {a, b, c, d, e}
        take[i] = {v = v, ttl = ttl}
        local _, nw = bounds(p, v)
        newest = nw
      end
      if ARGV[ARGV_NOW] == '' then
        ahead(KEYS[i], p, newest, now, 'carried state: ')
      end
    end
  end
  for i, p in ipairs(ev.policies) do
    local c = take[i]
    if c ~= nil and c.leases ~= nil then
      redisCall('DEL', KEYS[i])
      for j = 1, #c.leases, 1000 do
        redisCall('ZADD', KEYS[i], unpack(c.leases, j, mathMin(j + 999, #c.leases)))
      end
      redisCall('PEXPIRE', KEYS[i], fmt(c.ttl))
      ev.states[i] = readState(KEYS[i], p, now, false) -- checked as carried
    elseif c ~= nil and c.v ~= nil then
      redisCall('SET', KEYS[i], encodeState(c.v, FIELDS[p.kind]), 'PX', fmt(c.ttl))
      ev.states[i] = c.v
    elseif c ~= nil then
      redisCall('DEL', KEYS[i])
      for j = 1, #c.entries, 1000 do
        redisCall('RPUSH', KEYS[i], unpack(c.entries, j, mathMin(j + 999, #c.entries)))
      end
      redisCall('PEXPIRE', KEYS[i], fmt(c.ttl))
      ev.states[i] = readState(KEYS[i], p, now, false) -- checked as carried
    end
  end
end

------------------------------------------------------------------------

-- Policies whose arguments were read and checked, by their argument
-- string. A function library keeps this table from one call to the next
-- (a script, before Redis 7, starts every call with it empty), so a
-- policy's numbers are parsed and checked once, not on every decision;
-- the policies in it are never modified. It is emptied when it holds
-- checkedMax policies.
local checked, nChecked, checkedMax = {}, 0, 1000

-- parsePolicy reads and checks the argument of policy i, raw: the policy
-- as engine.lua takes it, with its TTL grace.
local function parsePolicy(raw, i)
  local kind, limit, window, burst, grace, align = string.match(raw, '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) ([01])$')
  local p = {kind = arg(kind), limit = arg(limit), window = arg(window), burst = arg(burst), grace = arg(grace), aligned = align == '1'}
  kind = p.kind
  if kind == nil or not (p.limit and p.window and p.burst and p.grace) then
    raise('SLUICE_ARGS', 'policy ' .. i .. ': want algorithm, limit, window, burst, grace and align (0 or 1) as integers joined by spaces')
  end
  local field, rule = check(p, kind)
  if field == nil and kind ~= KIND_TOKEN_BUCKET and kind ~= KIND_GCRA and p.burst ~= p.limit then
    field, rule = 'burst', 'applies only to token_bucket and gcra'
  elseif field == nil and (p.grace < 0 or p.grace > MAX_GRACE) then
    field, rule = 'grace', 'must be between 0 and ' .. fmt(MAX_GRACE) .. ' µs'
  end
  if field ~= nil then
    raise('SLUICE_ARGS', 'policy ' .. i .. ': ' .. field .. ' ' .. rule)
  end
  return p
end

-- policyOf returns policy i, its argument raw, checked: the policy as
-- engine.lua takes it, with its TTL grace (p.grace).
local function policyOf(raw, i)
  local p = checked[raw]
  if p == nil then
    p = parsePolicy(raw, i)
    if nChecked >= checkedMax then
      checked, nChecked = {}, 0
    end
    checked[raw], nChecked = p, nChecked + 1
  end
  return p
end

-- redisTime returns the time of this call by Redis TIME, in µs.
local function redisTime()
  local t = redisCall('TIME')
  return toNumber(t[1]) * 1000000 + toNumber(t[2])
end

-- callerClock returns the caller's time now and its maximum clock
-- regression, read from their arguments and checked.
local function callerClock(rawNow, rawRegression)
  local now, maxRegression = arg(rawNow), arg(rawRegression)
  if now == nil or now < 1 or now >= MAX_EXACT then
    raise('SLUICE_ARGS', 'now must be an integer number of µs in [1, 2^53)')
  end
  if maxRegression == nil or maxRegression < -1 then
    raise('SLUICE_ARGS', 'maximum clock regression must be an integer >= -1')
  end
  return now, maxRegression
end

-- clockUnsafe raises SLUICE_CLOCK: the caller's clock lies behind the
-- newest write to key by more than maxRegression.
local function clockUnsafe(key, behind, maxRegression)
  raise('SLUICE_CLOCK', key .. ': caller clock is ' .. fmt(behind) ..
    ' µs behind the last write, more than the allowed ' .. fmt(maxRegression))
end

-- main decides one call; KEYS and ARGV are the call's keys and arguments,
-- and at, when not nil, the time of this call read already by redisTime.
local function main(KEYS, ARGV, at)
  local rawID = ARGV[ARGV_ID] or ''
  local n = #KEYS
  if rawID ~= '' then
    n = n - 2
  end
  local carry = ARGV[ARGV_CARRY]
  local perPolicy = ARGV_PER_POLICY
  if carry == 'carry' then
    perPolicy = ARGV_PER_POLICY + CARRY_PER_POLICY
  elseif carry ~= '' and carry ~= 'probe' then
    raise('SLUICE_ARGS', 'carry must be "", probe or carry')
  end
  if n < 1 or #ARGV ~= ARGV_POLICIES + perPolicy * n then
    raise('SLUICE_ARGS', 'want ' .. ARGV_POLICIES .. ' + ' .. perPolicy .. ' ARGV per policy key, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
  end
  local cost = arg(ARGV[ARGV_COST])
  if cost == nil or cost < 0 then
    raise('SLUICE_ARGS', 'cost must be an integer >= 0')
  end
  local op = ARGV[ARGV_OP]
  if not OPS[op] then
    raise('SLUICE_ARGS', 'op must be spend, peek, refund, reset, acquire, release or renew')
  end
  local hold = arg(ARGV[ARGV_HOLD])
  if hold == nil or hold < 0 or hold > MAX_WINDOW or (hold > 0 and op ~= 'spend') then
    raise('SLUICE_ARGS', 'hold must be an integer of 0 to ' .. fmt(MAX_WINDOW) .. ' µs, 0 unless the op is spend')
  end
  local reset = op == 'reset'
  if reset and carry ~= '' then
    raise('SLUICE_ARGS', 'a reset carries no state')
  end
  local id = recordID(rawID, op)
  if id == '' and rawID ~= '' then
    raise('SLUICE_ARGS', 'a peek is never remembered: send no evaluation id')
  end
  local dttl, dmax
  if id ~= '' then
    dttl, dmax = arg(ARGV[ARGV_DEDUPE_TTL]), arg(ARGV[ARGV_DEDUPE_MAX])
    if dttl == nil or dttl < 1000 or dttl > MAX_DEDUPE_TTL or dmax == nil or dmax < 1 or dmax > MAX_DEDUPE_IDS then
      raise('SLUICE_ARGS', 'dedupe TTL must be 1000 to ' .. fmt(MAX_DEDUPE_TTL) .. ' µs and dedupe max 1 to ' .. MAX_DEDUPE_IDS)
    end
  end
  local now
  local maxRegression = -1
  if ARGV[ARGV_NOW] == '' then
    now = at or redisTime()
  else
    now, maxRegression = callerClock(ARGV[ARGV_NOW], ARGV[ARGV_MAX_REGRESSION])
  end

  -- Every field evaluate sets is named here, so the table is built at its
  -- size once rather than grown.
  local ev = {policies = {}, states = {}, now = now, op = op, cost = cost, hold = hold, lease = ARGV[ARGV_LEASE], maxRegression = maxRegression,
    replay = nil, decisions = nil, writes = nil, commit = false, replayed = false}
  local policies, states, redisTime = ev.policies, ev.states, ARGV[ARGV_NOW] == ''
  for i = 1, n do
    policies[i] = policyOf(ARGV[ARGV_POLICIES + i], i)
  end
  for i = 1, n do
    local st
    if not reset then -- a reset deletes whatever is there, corrupt state included
      st = readState(KEYS[i], policies[i], now, redisTime)
    end
    states[i] = st
  end
  if carry == 'probe' then
    for i = 1, n do
      if not live(ev.policies[i], ev.states[i], now) then
        return {REPLY_ABSENT}
      end
    end
  elseif carry == 'carry' then
    carryOver(KEYS, ARGV, ev, now)
  end
  if id ~= '' then
    ev.replay = dedupeLookup(KEYS[n + 1], KEYS[n + 2], id, now)
  end
  local err = evaluate(ev)
  if err ~= nil and err.clock then
    clockUnsafe(KEYS[err.clock.policy + 1], err.clock.behind, err.clock.max)
  elseif err ~= nil then
    raise('SLUICE_ARGS', 'the evaluation id was first used with ' .. err.replay.first .. ' policies, now with ' .. err.replay.now)
  end
  local reply = ev.decisions -- the reply as it stands, its replayed flag first
  if ev.replayed then
    if redisTime then
      reply[#reply + 1] = now
    end
    return reply
  end
  if ev.commit then
    for i = 1, n do
      apply(KEYS[i], ev.policies[i].kind, ev.writes[i], ev.states[i] ~= nil, now, ev.policies[i].grace)
    end
  end
  if id ~= '' then
    dedupeRemember(KEYS[n + 1], KEYS[n + 2], id, now, dttl, dmax, ev.policies[1].grace, reply)
  end
  if redisTime then
    reply[#reply + 1] = now
  end
  return reply
end

------------------------------------------------------------------------
-- The common decision in short: one policy, a spend (held or not) or a
-- peek (a lease's acquire or release on a concurrency policy), no
-- evaluation id, nothing carried. Its arguments, instead of
-- ARGV_POLICIES + 1: its form, then the cost (for a lease, the lease),
-- for a held spend its hold in µs, then on the caller's clock now and the
-- maximum clock regression, then the policy's argument. The forms:
-- FAST_SPEND, FAST_HELD, FAST_PEEK, FAST_ACQUIRE and FAST_RELEASE on
-- Redis time, and the same in capitals on the caller's clock (a held
-- spend has a form of its own, so the others carry no hold). It is
-- decided by the functions main's evaluate calls (a fixed-size state on
-- values rather than tables), and answers and writes what main would.

local FAST_SPEND, FAST_HELD, FAST_PEEK, FAST_ACQUIRE, FAST_RELEASE = 's', 'h', 'p', 'a', 'r'

-- The operation of each form of the short decision.
local FAST_OPS = {
  [FAST_SPEND] = 'spend', [FAST_HELD] = 'spend', [FAST_PEEK] = 'peek', [FAST_ACQUIRE] = 'acquire', [FAST_RELEASE] = 'release',
  S = 'spend', H = 'spend', P = 'peek', A = 'acquire', R = 'release',
}

-- The number of arguments of each form of the short decision.
local FAST_ARGS = {
  [FAST_SPEND] = 3, [FAST_HELD] = 4, [FAST_PEEK] = 3, [FAST_ACQUIRE] = 3, [FAST_RELEASE] = 3,
  S = 5, H = 6, P = 5, A = 5, R = 5,
}

-- The forms on Redis time, and the held ones (their hold after the cost).
local FAST_ON_REDIS = {[FAST_SPEND] = true, [FAST_HELD] = true, [FAST_PEEK] = true, [FAST_ACQUIRE] = true, [FAST_RELEASE] = true}
local FAST_HELD_FORMS = {[FAST_HELD] = true, H = true}

-- fastView decides the short decision of op with cost or lease on key,
-- under p, a policy of a log or of leases, as main does.
local function fastView(key, p, op, cost, lease, now, maxRegression, onRedis)
  local st = readState(key, p, now, onRedis)
  local cur, t, behind = current(p, st, now, maxRegression)
  if cur == nil then
    clockUnsafe(key, behind, maxRegression)
  end
  local ds = {0}
  local w = step(p, cur, t, op, cost, 0, lease, ds, 1)
  w.fresh = cur ~= st
  if t ~= now then
    lengthen(ds, 1, t - now)
  end
  if ds[2] == 1 and op ~= 'peek' then
    apply(key, p.kind, w, st ~= nil, now, p.grace)
  end
  if onRedis then
    ds[#ds + 1] = now
  end
  return ds
end

-- fixedWindowFloor decides a short spend of cost on key under p, a fixed
-- window on Redis time (KIND_FIXED_WINDOW_END), at now, as fastMain's
-- general course would, with the least work: one GET, the checks and the
-- decision of fixed_window.lua, one SET that expires at the window's end
-- (applyFixed), nothing written on a denial. No clock rule: such a state
-- keeps no newest write (FixedWindowEnd.Newest), and a window ending too
-- far ahead is corrupt. The differential test's Redis-clock mode drives
-- it in the short form, and the general form beside it.
local function fixedWindowFloor(key, p, cost, now)
  local ends, count = 0, 0
  local raw = read(key, 'GET')
  if raw then
    ends, count = decodeFields(key, raw, 2)
    local why = fixedWindowEndCorrupt(ends, count, now)
    if why ~= nil then
      corrupt(key, why)
    end
  end
  local allowed, remaining, resetAfter, retryAfter
  ends, count, allowed, remaining, resetAfter, retryAfter = fixedWindowEndDecide(ends, count, p, now, cost)
  if allowed then
    applyFixed(key, KIND_FIXED_WINDOW_END, 2, fixedWindowEndExpires(ends, count), now, 0, ends, count)
  end
  return {0, allowed and 1 or 0, p.limit, remaining, resetAfter, retryAfter, now}
end

-- fastMain decides the short decision on key whose arguments are
-- args[o + 1] on; at is as main's.
local function fastMain(key, args, o, at)
  local form = args[o + 1]
  local op = FAST_OPS[form]
  local leases = op == 'acquire' or op == 'release'
  local cost, lease = 0, ''
  if leases then
    lease = args[o + 2]
  else
    cost = SMALL[args[o + 2]] or arg(args[o + 2])
    if cost == nil or cost < 0 then
      raise('SLUICE_ARGS', 'cost must be an integer >= 0')
    end
  end
  local hold = 0
  if FAST_HELD_FORMS[form] then
    o = o + 1 -- the arguments after the hold are where the other forms have theirs
    hold = arg(args[o + 2])
    if hold == nil or hold < 1 or hold > MAX_WINDOW then
      raise('SLUICE_ARGS', 'hold must be an integer of 1 to ' .. fmt(MAX_WINDOW) .. ' µs')
    end
  end
  local now, maxRegression, p
  local onRedis = FAST_ON_REDIS[form]
  if onRedis then
    now, maxRegression, p = at or redisTime(), -1, policyOf(args[o + 3], 1)
  else
    now, maxRegression = callerClock(args[o + 3], args[o + 4])
    p = policyOf(args[o + 5], 1)
  end
  local k = p.kind
  if k == KIND_FIXED_WINDOW_END and form == FAST_SPEND then
    return fixedWindowFloor(key, p, cost, now) -- the common decision of a fixed window on Redis time
  end
  if leases ~= (k == KIND_CONCURRENCY) then
    raise('SLUICE_ARGS', 'a short ' .. op .. ' does not take a policy of algorithm ' .. k)
  end
  if hold > 0 and k ~= KIND_FIXED_WINDOW and k ~= KIND_FIXED_WINDOW_END and k ~= KIND_TOKEN_BUCKET and k ~= KIND_GCRA then
    raise('SLUICE_ARGS', 'a held spend does not take a policy of algorithm ' .. k)
  end
  local n = FIELDS[k]
  if n == 0 then
    return fastView(key, p, op, cost, lease, now, maxRegression, onRedis)
  end
  local a, b, c, d, e = 0, 0, 0, 0, 0
  local t = now -- the time it is decided at
  local raw = read(key, 'GET')
  if raw then
    a, b, c, d, e = decodeChecked(key, raw, k, now)
    local exp, nw = boundsFixed(k, p, a, b, c, d, e)
    if onRedis then
      ahead(key, p, nw, now)
    end
    local live, behind
    live, t, behind = when(exp, nw, now, maxRegression)
    if behind ~= nil then
      clockUnsafe(key, behind, maxRegression)
    elseif not live then
      a, b, c, d, e = 0, 0, 0, 0, 0
    end
  end
  local allowed, remaining, resetAfter, retryAfter, expires, limit
  a, b, c, d, e, allowed, remaining, resetAfter, retryAfter, expires, limit = decideFixed(k, p, a, b, c, d, e, t, cost, false, hold)
  if t ~= now then
    resetAfter, retryAfter = lengthenBy(resetAfter, retryAfter, t - now)
  end
  if allowed and op == 'spend' then
    applyFixed(key, k, n, expires, now, p.grace, a, b, c, d, e)
  end
  return {0, allowed and 1 or 0, limit, remaining, resetAfter, retryAfter, onRedis and now or nil}
end

------------------------------------------------------------------------

-- answer turns what pcall returned of main or fastMain into the
-- decision's reply: its own, or its abort as an error reply.
local function answer(ok, res)
  if ok then
    return res
  end
  if type(res) == 'table' and res.sluice then
    return redis.error_reply(res.sluice)
  end
  if type(res) == 'table' and res.err then
    return res -- a call's error reply (OOM, READONLY, …), its code kept
  end
  -- A bug of this code: Lua's own message. Never raise it: in decideAll
  -- it would fail the other decisions too, and Redis 7.0 crashes on an
  -- error value that is neither a string nor an error reply.
  return redis.error_reply('ERR sluice: ' .. tostring(res))
end

-- decide runs main, or fastMain for a short decision, and turns an abort
-- into its error reply; at is as main's. It is the function the library
-- registers (FCALL), or the script's body (EVALSHA, with the globals KEYS
-- and ARGV): redisstore.go appends the line that does one or the other.
local function decide(keys, args, at)
  if redisCall == nil then
    bindLibrary()
  end
  local fast = FAST_ARGS[args[1]]
  if fast ~= nil and #keys == 1 and #args == fast then
    return answer(pcall(fastMain, keys[1], args, 0, at))
  end
  return answer(pcall(main, keys, args, at))
end

-- decideAll takes several decisions in one call, each as decide takes it
-- alone, and answers an array of their replies (or error replies), in
-- order. ARGV[1] is their number m and ARGV[1 + j] the number of keys of
-- decision j; KEYS holds the decisions' keys one after the other, and
-- ARGV, after those m + 1, their arguments likewise: ARGV_POLICIES plus
-- ARGV_PER_POLICY per policy each (no carried state: a decision that
-- carries some goes alone), or a short decision's (FAST_ARGS). Decisions on Redis time share one reading of
-- it, as they share this call. The library registers it beside decide
-- (FCALL <name>_all); it spares each decision the call's own cost.
local function decideAll(keys, args)
  if redisCall == nil then
    bindLibrary()
  end
  local m = arg(args[1])
  if m == nil or m < 1 or #args < 1 + m then
    return redis.error_reply('SLUICE_ARGS decideAll: want the number of decisions, then each one\'s number of keys')
  end
  local out, at = {}, nil
  local ko, ao = 0, 1 + m
  for j = 1, m do
    local nk = SMALL[args[1 + j]] or arg(args[1 + j])
    if nk == nil or nk < 1 or ko + nk > #keys then
      return redis.error_reply('SLUICE_ARGS decideAll: decision ' .. j .. ' names ' .. tostring(args[1 + j]) .. ' keys')
    end
    local na = FAST_ARGS[args[ao + 1]]
    if na ~= nil and nk == 1 then
      if ao + na > #args then
        return redis.error_reply('SLUICE_ARGS decideAll: decision ' .. j .. ' wants ' .. na .. ' arguments')
      end
      if at == nil and FAST_ON_REDIS[args[ao + 1]] then
        at = redisTime()
      end
      out[j] = answer(pcall(fastMain, keys[ko + 1], args, ao, at))
    else
      local n = nk
      if args[ao + ARGV_ID] ~= '' then
        n = n - 2
      end
      na = ARGV_POLICIES + ARGV_PER_POLICY * n
      local A = {unpack(args, ao + 1, ao + na)}
      if at == nil and A[ARGV_NOW] == '' then
        at = redisTime()
      end
      out[j] = decide({unpack(keys, ko + 1, ko + nk)}, A, at)
    end
    ko, ao = ko + nk, ao + na
  end
  return out
end
