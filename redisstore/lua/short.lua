--[[ short.lua: the common decision in short, the specialization of main
(redisstore.lua) that the differential test drives on every seed and
TestShortMatchesGeneral (short_test.go) holds to main, decision and Redis
state alike. Go twin: internal/engine/algorithm/one.go, DecideOne's
general course, decideOne (fastView: corrupt through readState, current,
step, Fresh, lengthen, commit; fastMain's fixed-size course the same on
values), which memstore's short course runs (for gcra by decideGCRA, Go
only, held to it); redisstore/short.go's Store.decideShort writes its
arguments, entered only on evaluation.Short.
fixedWindowFloor is DecideOne on a FixedWindowEnd with nothing to check
but its record. ]]

-- The common decision in short: one policy, a spend (held or not) or a
-- peek (a lease's acquire or release on a concurrency policy), no
-- evaluation id, nothing carried. Its arguments, instead of
-- LAYOUT.ARGV_POLICIES + 1: its form, then the cost (for a lease, the lease),
-- for a held spend its hold in µs, then on the caller's clock now and the
-- maximum clock regression, then the policy's argument. The forms
-- (FAST_FORM): SPEND, HELD, PEEK, ACQUIRE and RELEASE on Redis time, and
-- the same in capitals on the caller's clock (a held
-- spend has a form of its own, so the others carry no hold). It is
-- decided by the functions main's evaluate calls (a fixed-size state on
-- values rather than tables), and answers and writes what main would.

-- The forms of the short decision on Redis time (short.go's
-- fastForms and fastHeld): one table, not a local each.
local FAST_FORM = {SPEND = 's', HELD = 'h', PEEK = 'p', ACQUIRE = 'a', RELEASE = 'r'}

-- The operation of each form of the short decision.
local FAST_OPS = {
  [FAST_FORM.SPEND] = 'spend', [FAST_FORM.HELD] = 'spend', [FAST_FORM.PEEK] = 'peek', [FAST_FORM.ACQUIRE] = 'acquire', [FAST_FORM.RELEASE] = 'release',
  S = 'spend', H = 'spend', P = 'peek', A = 'acquire', R = 'release',
}

-- The number of arguments of each form of the short decision.
local FAST_ARGS = {
  [FAST_FORM.SPEND] = 3, [FAST_FORM.HELD] = 4, [FAST_FORM.PEEK] = 3, [FAST_FORM.ACQUIRE] = 3, [FAST_FORM.RELEASE] = 3,
  S = 5, H = 6, P = 5, A = 5, R = 5,
}

-- The forms on Redis time, and the held ones (their hold after the cost).
local FAST_ON_REDIS = {[FAST_FORM.SPEND] = true, [FAST_FORM.HELD] = true, [FAST_FORM.PEEK] = true, [FAST_FORM.ACQUIRE] = true, [FAST_FORM.RELEASE] = true}
local FAST_HELD_FORMS = {[FAST_FORM.HELD] = true, H = true}

-- fastDecision is where fastView has step put its decision: one table
-- for every call, read out before the next, so no decision allocates one.
local fastDecision = {0, 0, 0, 0, 0, 0}

-- fastView decides the short decision of op with cost or lease on key,
-- under p, a policy of a log or of leases, as main does, and returns
-- its allowed, limit, remaining, resetAfter and retryAfter.
-- fastView ports DecideOne, on a log or leases.
local function fastView(key, p, op, cost, lease, now, maxRegression, onRedis)
  local st = readState(key, p, now, onRedis)
  local cur, t, behind = current(p, st, now, maxRegression, key)
  if cur == nil then
    clockUnsafe(key, behind, maxRegression)
  end
  local ds = fastDecision -- step writes all five values; they are read out below
  local w = step(p, cur, t, op, cost, 0, lease, ds, 1)
  w.fresh = cur ~= st
  if t ~= now then
    lengthen(ds, 1, t - now)
  end
  if ds[2] == 1 and op ~= 'peek' then
    apply(key, p.kind, w, st ~= nil, now, p.grace)
  end
  return ds[2] == 1, ds[3], ds[4], ds[5], ds[6]
end

-- leaseFloor decides a short acquire or release of lease on key under
-- p, a concurrency policy, on Redis time at now, as fastView would, with
-- the least work in the states a lease's pair meets: an acquire on no
-- lease (ZCARD, then apply's ZADD and PEXPIRE), a release with no lease
-- held (ZCARD alone: the key is absent, apply's DEL would find nothing)
-- or of the only one (ZCARD, its ZRANGE, apply's DEL: expired or live,
-- no lease is left after it), on values rather than a view, an edit and
-- a write. The lease read is checked as readState checks it
-- (concurrencyEntry's score rule, ahead); one that fails, and any other
-- state, goes by fastView, which reads it again and raises the error
-- that names the rule. It returns the decision's allowed, limit,
-- remaining, resetAfter and retryAfter.
-- leaseFloor ports DecideOne, on a Concurrency acquired or released on Redis time.
local function leaseFloor(key, p, op, lease, now)
  local n, limit = read(key, 'ZCARD'), p.limit
  if n == 0 and lease ~= '' then
    if op == 'release' then -- concurrencyRelease of an absent state
      return true, limit, limit, 0, 0
    end
    local at = now + p.window -- concurrencyDecide's acquisition on an absent state
    redisCall('ZADD', key, fmt(at), lease)
    redisCall('PEXPIRE', key, px(at, now, p.grace))
    return true, limit, limit - p.reserve - 1, p.window, 0 -- Remaining: the class's ceiling (Params.ceiling) less this lease
  elseif n == 1 and op == 'release' and lease ~= '' then
    local r = redisCall('ZRANGE', key, '0', '0', 'WITHSCORES')
    local v = int(r[2])
    if r[1] == lease and v ~= nil and v >= 1 and v - p.window - now <= p.window + p.grace then
      redisCall('DEL', key) -- concurrencyRelease of the only lease, or of an expired state
      return true, limit, limit, 0, 0
    end
  end
  return fastView(key, p, op, 0, lease, now, -1, true)
end

-- FLOOR keeps what fixedWindowFloor's writes reuse from one call to the
-- next (a function library keeps it): ends, the window end it last
-- opened, with head, the start of that state's stored form (the byte
-- STATE_BINARY and the end), and pxat, its PXAT argument (the windows
-- of a clock-aligned policy, and those a batch opens at one time, end
-- together, so most writes format no time); and counts, the stored form
-- of the small counts. One table, not a local each (Lua's 200 locals).
local FLOOR = {ends = 0, head = '', pxat = '', counts = {}}

-- fixedWindowFloor decides a short spend of cost on key under p, a fixed
-- window on Redis time (KIND_FIXED_WINDOW_END), at now, as fastMain's
-- general course would, with the least work: one GET, then
-- fixedWindowEndCorrupt's and fixedWindowEndDecide's rules written out
-- on values (a call each costs more than their tests), then one SET,
-- nothing on a denial. The window a spend opens is written with PXAT,
-- its end rounded up to the ms (applyFixed's, ceilDiv on values); in a
-- window that goes on, SETRANGE writes the count's 8 bytes over the
-- stored form (encodeFields': the end's bytes stay as GET read them) and
-- keeps the TTL its opening set: the same instant, without an expiry to
-- format, rewrite and store, a value to build or a status reply to read
-- on every spend. No clock rule: such a state keeps no newest write
-- (FixedWindowEnd.Newest), and a window ending too far ahead is corrupt.
-- A state that fails the checks is read again by decodeChecked, whose
-- error names the field and the rule. A WRONGTYPE error of its GET is
-- left to its caller (shortError makes it SLUICE_CORRUPT, as read does).
-- The differential test's Redis-clock mode drives it in the short form,
-- batched, and the general form beside it. It returns the decision's
-- allowed, limit, remaining, resetAfter and retryAfter.
-- fixedWindowFloor ports DecideOne, on a FixedWindowEnd spent on Redis time.
local function fixedWindowFloor(key, p, cost, now)
  local ends, count, kept = 0, 0, false -- kept: the stored form is binary (SETRANGE writes into it)
  local raw = redisCall('GET', key)
  if raw then
    local b
    if #raw == 17 then
      b, ends, count = structUnpack('<Bdd', raw)
    end
    -- fixedWindowEndCorrupt and decodeFields' field checks in one test
    -- (NaN fails every comparison, -0 the lower bounds)
    if b == STATE_BINARY and count >= 1 and count <= MAX_LIMIT and count % 1 == 0 and
      ends >= 1 and ends - now <= MAX_WINDOW and ends % 1 == 0 then
      kept = true
    else -- corrupt (it raises, naming why), or an older version's decimals
      ends, count = decodeChecked(key, raw, KIND_FIXED_WINDOW_END, now)
    end
  end
  local limit, ceiling = p.limit, p.limit - p.reserve -- Params.ceiling
  if count == 0 or now >= ends then -- fixedWindowEndDecide's new window
    count, ends, kept = 0, now, false
    if p.aligned then
      ends = fixedWindowStart(p, now)
    end
    ends = ends + p.window
  end
  local need = cost
  if need == 0 then
    need = 1 -- verdictCost
  end
  if count + need > ceiling then
    -- Count > Limit after a limit was lowered: remaining 0.
    return false, limit, mathMax(ceiling - count, 0), ends - now, ends - now
  end
  count = count + cost
  if count == 0 then
    redisCall('DEL', key) -- a spend of 0 on no window: absent, as applyFixed deletes it
    return true, limit, ceiling, 0, 0
  end
  local tail = FLOOR.counts[count]
  if tail == nil then
    tail = structPack('<d', count)
    if count <= 4096 then
      FLOOR.counts[count] = tail
    end
  end
  if kept then -- the window goes on: its TTL is its end already
    redisCall('SETRANGE', key, '9', tail) -- the count's 8 bytes, in place
  else
    if ends ~= FLOOR.ends then
      local ms = mathFloor((ends + 999) / 1000) -- ceilDiv(ends, 1000), exact below 2^53
      if ms * 1000 < ends then
        ms = ms + 1
      elseif (ms - 1) * 1000 >= ends then
        ms = ms - 1
      end
      FLOOR.ends, FLOOR.head, FLOOR.pxat = ends, structPack('<Bd', STATE_BINARY, ends), stringFormat('%d', ms)
    end
    redisCall('SET', key, FLOOR.head .. tail, 'PXAT', FLOOR.pxat)
  end
  return true, limit, ceiling - count, ends - now, 0
end

-- shortError returns what pcall answers for e, the abort of a short
-- decision on key (fastMain, specMain, fixedWindowFloor, whose GET is a
-- redis.call: cheaper than read's redis.pcall): a GET that found another
-- type is SLUICE_CORRUPT (read's error, from pcall), any other abort as it
-- came.
-- shortError ports Store.classify's other side: the error reply it reads.
local function shortError(key, e)
  local msg = e
  if type(msg) == 'table' then
    msg = msg.err
  end
  if type(msg) == 'string' and stringFind(msg, '^WRONGTYPE') then
    return pcall(read, key, 'GET')
  end
  return false, e
end

-- shortDecide decides the short decision of op (with cost, a spend's
-- hold in µs, or lease) on key under p, a checked policy, at now with
-- maxRegression (-1 on Redis time, onRedis), and returns its allowed,
-- limit, remaining, resetAfter and retryAfter: fastMain's course once its
-- arguments are read, and a batched decision's (specMain).
-- shortDecide ports DecideOne.
local function shortDecide(key, p, op, cost, hold, lease, now, maxRegression, onRedis)
  local k = p.kind
  if k == KIND_FIXED_WINDOW_END and op == 'spend' and hold == 0 and onRedis then
    -- the common decision of a fixed window on Redis time
    return fixedWindowFloor(key, p, cost, now)
  end
  if (op == 'acquire' or op == 'release') ~= (k == KIND_CONCURRENCY) then
    raise('SLUICE_ARGS', 'a short ' .. op .. ' does not take a policy of algorithm ' .. k)
  elseif k == KIND_CONCURRENCY and onRedis then
    return leaseFloor(key, p, op, lease, now)
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
  local raw = redisCall('GET', key) -- a WRONGTYPE abort: shortError
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
  if k == KIND_FIXED_PERIOD then
    fixedPeriodOutside(key, p, t) -- current's rule for a calendar period
  end
  local allowed, remaining, resetAfter, retryAfter, expires, limit
  a, b, c, d, e, allowed, remaining, resetAfter, retryAfter, expires, limit = decideFixed(k, p, a, b, c, d, e, t, cost, false, hold)
  if t ~= now then
    resetAfter, retryAfter = lengthenBy(resetAfter, retryAfter, t - now)
  end
  if allowed and op == 'spend' then
    applyFixed(key, k, n, expires, now, p.grace, a, b, c, d, e)
  end
  return allowed, limit, remaining, resetAfter, retryAfter
end

-- fastMain decides the short decision on key whose arguments are
-- args[o + 1] on; at is as main's. It answers main's reply.
-- fastMain ports Store.decideShort's other side: it reads the arguments decideShort writes.
local function fastMain(key, args, o, at)
  local form = args[o + 1]
  local op = FAST_OPS[form]
  local cost, lease = 0, ''
  if op == 'acquire' or op == 'release' then
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
  local allowed, limit, remaining, resetAfter, retryAfter = shortDecide(key, p, op, cost, hold, lease, now, maxRegression, onRedis)
  return {0, allowed and 1 or 0, limit, remaining, resetAfter, retryAfter, onRedis and now or nil}
end

-- Short decisions of a batch on Redis time (decideAll) by their spec: the
-- form (FAST_FORM.SPEND, FAST_FORM.HELD or FAST_FORM.PEEK; a lease's
-- FAST_FORM.ACQUIRE or FAST_FORM.RELEASE, cost and hold 0, each decision
-- naming its lease in an argument of its own), cost, hold in µs (0 unless
-- held) and the policy's argument, joined by spaces, e.g. "s 1 0 5 100
-- 1000000 20 0 0" (short.go's shortSpec). A function library keeps
-- this table from one call to the next, as args.lua's checked, so a spec
-- is read and checked once; it is emptied when it holds CACHED.max.
local specs = {}

-- specOf returns the spec raw, read and checked: {op, cost, hold, p,
-- floor, leased}.
-- specOf ports shortSpec's other side: it reads the spec shortSpec writes.
local function specOf(raw)
  local sp = specs[raw]
  if sp ~= nil then
    return sp
  end
  local form, rawCost, rawHold, rawPolicy = string.match(raw, '^([shpar]) (%d+) (%d+) (.+)$')
  local cost, hold = arg(rawCost), arg(rawHold)
  if form == nil or cost == nil or hold == nil then
    raise('SLUICE_ARGS', 'spec: want form (s, h, p, a or r), cost, hold and a policy, joined by spaces')
  end
  local leased = form == FAST_FORM.ACQUIRE or form == FAST_FORM.RELEASE
  if (form == FAST_FORM.HELD) ~= (hold > 0) or hold > MAX_WINDOW then
    raise('SLUICE_ARGS', 'spec: hold must be 1 to ' .. fmt(MAX_WINDOW) .. ' µs in form h, 0 in the others')
  end
  local p = policyOf(rawPolicy, 1)
  if leased and (cost ~= 0 or hold ~= 0 or p.kind ~= KIND_CONCURRENCY) then
    raise('SLUICE_ARGS', 'spec: a lease\'s form (a or r) takes cost 0, hold 0 and a concurrency policy')
  end
  -- floor: the common decision of a fixed window on Redis time, which
  -- decideAll runs as fixedWindowFloor without shortDecide's course;
  -- leased: a lease's, run as leaseFloor, its lease an argument of each.
  sp = {op = FAST_OPS[form], cost = cost, hold = hold, p = p, floor = form == FAST_FORM.SPEND and p.kind == KIND_FIXED_WINDOW_END,
    leased = leased}
  if CACHED.specs >= CACHED.max then
    specs, CACHED.specs = {}, 0
  end
  specs[raw], CACHED.specs = sp, CACHED.specs + 1
  return sp
end

-- specRun decides the decisions i + 1 to n of a run by the spec sp in a
-- decideAll call, their keys keys[ko + i + 1] on (by a lease's spec, their
-- leases args[ao + i + 1] on), at now, Redis time, each as shortDecide
-- would (fixedWindowFloor when sp.floor, leaseFloor when sp.leased), and puts
-- their replies in out from out[o + 1] on, as decideAll answers them: an
-- admitted decision with no retry as its remaining and resetAfter, any
-- other as fastMain's reply. It returns the last index of out written.
-- done[1] is the decision under way: an error aborts only that one
-- (decideAll answers it in its place and calls specRun again for the
-- rest), so one pcall takes a run rather than one per decision.
-- specRun ports DecideOne, by a spec.
local function specRun(keys, ko, args, ao, i, n, sp, now, out, o, done)
  local p, cost, floor, leased = sp.p, sp.cost, sp.floor, sp.leased
  for j = i + 1, n do
    done[1] = j
    local allowed, limit, remaining, resetAfter, retryAfter
    if floor then
      allowed, limit, remaining, resetAfter, retryAfter = fixedWindowFloor(keys[ko + j], p, cost, now)
    elseif leased then
      allowed, limit, remaining, resetAfter, retryAfter = leaseFloor(keys[ko + j], p, sp.op, args[ao + j], now)
    else
      allowed, limit, remaining, resetAfter, retryAfter = shortDecide(keys[ko + j], p, sp.op, cost, sp.hold, '', now, -1, true)
    end
    if allowed and retryAfter == 0 then
      out[o + 1], out[o + 2], o = remaining, resetAfter, o + 2
    else
      out[o + 1], o = {0, allowed and 1 or 0, limit, remaining, resetAfter, retryAfter, now}, o + 1
    end
  end
  return o
end
