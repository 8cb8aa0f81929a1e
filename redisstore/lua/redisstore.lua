--[[ redisstore.lua: one sluice decision, atomically, for one subject and
one or more policies: either every policy admits the cost and it is spent
on all of them, or nothing is written. The entry points and main, the I/O
shim around the engine (engine.lua): the keys read into states
(records.lua), the engine's evaluate, the writes and TTLs kept
(records.lua), the evaluation id remembered (dedupe.lua). main ports the
part of redisstore.Store.Evaluate that runs in Redis, as
memstore.Store.Evaluate runs the Go engine.

KEYS[1..n]  the state key of policy i: <prefix>{<subject>}<policy id>:<revision>:<algorithm code>.
         With an evaluation id, KEYS[n+1] is the sorted set of remembered ids
         (score: expiry in µs) and KEYS[n+2] the hash id -> remembered reply,
         both of the first policy. All keys of one call share the subject's
         hash tag (one Cluster slot).
ARGV, by the named positions below (redisstore.go names them alike):
  LAYOUT.ARGV_COST            cost, an integer >= 0: the units a spend, refund or acquire takes.
  LAYOUT.ARGV_NOW             now in µs since the Unix epoch (caller clock), or "" to
                       read the time with Redis TIME (one clock for every caller).
  LAYOUT.ARGV_MAX_REGRESSION  caller clock only: the most, in µs, now may lie behind a
                       state's newest write; -1 means unbounded.
  LAYOUT.ARGV_OP              the operation, algorithm.Op's name (OPS, args.lua; "reset"
                       deletes every policy's state, whatever it holds). Its rules
                       are algorithm.Check's, run by redisstore.go before the call;
                       this script checks only that the arguments are well-formed.
  LAYOUT.ARGV_ID              the evaluation id, or "" (then KEYS holds no id keys).
  LAYOUT.ARGV_DEDUPE_TTL      how long a decision for an id is remembered, µs.
  LAYOUT.ARGV_DEDUPE_MAX      how many ids are remembered at most.
  LAYOUT.ARGV_CARRY           a key rotation (sluice.Evaluation.Previous): "" (none), "probe"
                       (answer {LAYOUT.REPLY_ABSENT}, deciding and writing nothing, when a
                       policy has no live state), or "carry": then LAYOUT.CARRY_PER_POLICY
                       more arguments per policy follow the policies', the state
                       read under an older subject ("" for none; a fixed-size
                       state as stored, a log's entries joined by ',') and its
                       TTL in ms, taken by a policy without a live state (carry.lua).
  LAYOUT.ARGV_LEASE           the lease an acquire takes on each concurrency policy, or
                       the one a release or renewal names; "" for none.
  LAYOUT.ARGV_HOLD            a held spend's hold in µs (a spend here, algorithm.OpHold in Go,
                       its rules Check's), or a book's most wait in µs (the longest it
                       may wait for its slot), in [0, MAX_WINDOW]; 0 for any other op.
  then one argument per policy, from LAYOUT.ARGV_POLICIES + 1: its algorithm
  (algorithm.Kind: on Redis time a fixed window is KindFixedWindowEnd,
  whose key expires at the window's end with no grace), limit, window in µs, burst, TTL grace in µs
  (CleanupGrace + ExtraTTL) and align (1: a fixed window on the clock's
  boundaries, Params.Aligned; else 0), in that order, as decimals joined
  by spaces, e.g. "5 100 1000000 20 0 0" (the same string for every decision of the
  policy, so it is parsed and checked once); a calendar period's four
  bounds follow; a priority class that holds part of the capacity back
  (Params.Reserve) ends it with " r" and that reserve, e.g. " r10" (one
  string, and one cache entry, per policy and class).

Reply: replayed (1 when the reply is the one remembered for the evaluation
id, else 0), then LAYOUT.REPLY_PER_POLICY integers per policy, in KEYS order:
allowed (1 or 0), limit, remaining, reset_after (µs), retry_after (µs);
for a settle, then charged, given back and owed of each policy; for a
book (one policy), then the delay (µs) until its booked slot, 0 when
admitted now or denied;
on Redis time, then the time the call decided at (µs), so that a reader
of the reply (the differential test) can decide it again.
Errors, raised before any write: "SLUICE_ARGS <reason>",
"SLUICE_CORRUPT <key>: <reason>" (state this script did not write: wrong
type, not its integers, or integers no decision of it leaves behind:
readState), "SLUICE_CLOCK <key>: <reason>" (caller clock too
far behind). An error Redis raises in a call (OOM, READONLY, …) aborts the
script with that error.
Time source: LAYOUT.ARGV_NOW or Redis TIME, never both (TTLs: records.lua).
Needs Redis >= 5 (TIME in a script), 6.2 for SET … PXAT; on Redis >= 7
it is a function library called with FCALL (script.go). ]]

-- generalArgs reads and checks the arguments of one call in the general
-- form; KEYS and ARGV are the call's keys and arguments, and at, when not
-- nil, the time of this call read already by redisTime. It returns the
-- evaluation (every field evaluate sets named, so the table is built at
-- its size once rather than grown), the number of policies, the
-- evaluation id as sent and as recorded (algorithm.RecordID), the carry
-- and the dedupe TTL and maximum.
-- generalArgs ports Store.decide's other side: it reads the general form decide writes.
local function generalArgs(KEYS, ARGV, at)
  local rawID = ARGV[LAYOUT.ARGV_ID] or ''
  local n = #KEYS
  if rawID ~= '' then
    n = n - 2
  end
  local carry = ARGV[LAYOUT.ARGV_CARRY]
  local perPolicy = LAYOUT.ARGV_PER_POLICY
  if carry == 'carry' then
    perPolicy = LAYOUT.ARGV_PER_POLICY + LAYOUT.CARRY_PER_POLICY
  elseif carry ~= '' and carry ~= 'probe' then
    raise('SLUICE_ARGS', 'carry must be "", probe or carry')
  end
  if n < 1 or #ARGV ~= LAYOUT.ARGV_POLICIES + perPolicy * n then
    raise('SLUICE_ARGS', 'want ' .. LAYOUT.ARGV_POLICIES .. ' + ' .. perPolicy .. ' ARGV per policy key, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
  end
  local cost = arg(ARGV[LAYOUT.ARGV_COST])
  if cost == nil or cost < 0 then
    raise('SLUICE_ARGS', 'cost must be an integer >= 0')
  end
  local op = ARGV[LAYOUT.ARGV_OP]
  if not OPS[op] then
    raise('SLUICE_ARGS', 'op must be spend, peek, refund, reset, acquire, release, renew, estimate, settle or book')
  end
  local hold = arg(ARGV[LAYOUT.ARGV_HOLD])
  if hold == nil or hold < 0 or hold > MAX_WINDOW or (hold > 0 and op ~= 'spend' and op ~= 'book') then
    raise('SLUICE_ARGS', 'hold must be an integer of 0 to ' .. fmt(MAX_WINDOW) .. ' µs, 0 unless the op is spend or book')
  end
  if op == 'reset' and carry ~= '' then
    raise('SLUICE_ARGS', 'a reset carries no state')
  end
  local id = recordID(rawID, op)
  if id == '' and rawID ~= '' then
    raise('SLUICE_ARGS', 'a peek is never remembered: send no evaluation id')
  end
  local dttl, dmax
  if id ~= '' then
    dttl, dmax = arg(ARGV[LAYOUT.ARGV_DEDUPE_TTL]), arg(ARGV[LAYOUT.ARGV_DEDUPE_MAX])
    if dttl == nil or dttl < 1000 or dttl > LAYOUT.MAX_DEDUPE_TTL or dmax == nil or dmax < 1 or dmax > LAYOUT.MAX_DEDUPE_IDS then
      raise('SLUICE_ARGS', 'dedupe TTL must be 1000 to ' .. fmt(LAYOUT.MAX_DEDUPE_TTL) .. ' µs and dedupe max 1 to ' .. LAYOUT.MAX_DEDUPE_IDS)
    end
  end
  local now
  local maxRegression = -1
  if ARGV[LAYOUT.ARGV_NOW] == '' then
    now = at or redisTime()
  else
    now, maxRegression = callerClock(ARGV[LAYOUT.ARGV_NOW], ARGV[LAYOUT.ARGV_MAX_REGRESSION])
  end
  local ev = {policies = {}, states = {}, now = now, op = op, cost = cost, hold = hold, lease = ARGV[LAYOUT.ARGV_LEASE], maxRegression = maxRegression,
    replay = nil, decisions = nil, writes = nil, commit = false, replayed = false, others = ''}
  return ev, n, rawID, id, carry, dttl, dmax
end

-- main decides one call in the general form; KEYS and ARGV are the
-- call's keys and arguments, and at, when not nil, the time of this call
-- read already by redisTime.
-- main ports Store.decide's other side: it reads the general form decide writes, and runs Evaluate as memstore does.
local function main(KEYS, ARGV, at)
  local ev, n, rawID, id, carry, dttl, dmax = generalArgs(KEYS, ARGV, at)
  local now, op, cost, reset = ev.now, ev.op, ev.cost, ev.op == 'reset'
  local policies, states, redisTime = ev.policies, ev.states, ARGV[LAYOUT.ARGV_NOW] == ''
  for i = 1, n do
    policies[i] = policyOf(ARGV[LAYOUT.ARGV_POLICIES + i], i)
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
        return {LAYOUT.REPLY_ABSENT}
      end
    end
  elseif carry == 'carry' then
    carryOver(KEYS, ARGV, ev, now)
  end
  local recorded = id ~= '' and (op == 'estimate' or op == 'settle') -- records with an Extra (settle.lua)
  if recorded then
    ev.others = others(KEYS, n)
    lookupFor(ev, KEYS[n + 1], KEYS[n + 2], rawID, id, now)
  elseif id ~= '' then
    ev.replay = dedupeLookup(KEYS[n + 1], KEYS[n + 2], id, now)
  end
  local err
  if op == 'settle' then
    err = evaluateSettle(ev)
  else
    err = evaluate(ev)
  end
  if err ~= nil and err.clock then
    clockUnsafe(KEYS[err.clock.policy + 1], err.clock.behind, err.clock.max)
  elseif err ~= nil and err.settle then
    raise('SLUICE_ARGS', err.settle)
  elseif err ~= nil and err.corrupt then
    corrupt(KEYS[n + 2], 'a remembered record: ' .. err.corrupt)
  elseif err ~= nil then
    raise('SLUICE_ARGS', 'the evaluation id was first used with ' .. err.replay.first .. ' policies, now with ' .. err.replay.now)
  end
  local reply = ev.decisions -- the reply as it stands, its replayed flag first
  local extra = ev.extra -- a settle's, answered after the decisions; nil for any other op
  if not ev.replayed then -- a replay writes nothing
    if ev.commit then
      for i = 1, n do
        apply(KEYS[i], ev.policies[i].kind, ev.writes[i], ev.states[i] ~= nil, now, ev.policies[i].grace)
      end
    end
    if recorded then
      local kept = extra
      if op == 'estimate' then
        kept = estimateExtra(cost, now)
      end
      recordRemember(KEYS[n + 1], KEYS[n + 2], id, now, dttl, dmax, ev.policies[1].grace, reply, kept, ev.others)
    elseif id ~= '' then
      dedupeRemember(KEYS[n + 1], KEYS[n + 2], id, now, dttl, dmax, ev.policies[1].grace, reply)
    end
  end
  for i = 1, extra and #extra or 0 do
    reply[#reply + 1] = extra[i]
  end
  if redisTime then
    reply[#reply + 1] = now
  end
  return reply
end

-- answer turns what pcall returned of main or fastMain into the
-- decision's reply: its own, or its abort as an error reply.
-- answer ports Store.classify's other side: the error replies it reads.
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
-- decide ports Store.decide: the short form or the general one.
local function decide(keys, args, at)
  if redisCall == nil then
    bindLibrary()
  end
  local fast = FAST_ARGS[args[1]]
  if fast ~= nil and #keys == 1 and #args == fast then
    local ok, res = pcall(fastMain, keys[1], args, 0, at)
    if not ok then
      ok, res = shortError(keys[1], res)
    end
    return answer(ok, res)
  end
  return answer(pcall(main, keys, args, at))
end
