-- Batches of decisions (and refunds), in groups: each group is the calls
-- on one set of buckets (a bucket, or a cascade's bucket and its
-- parent's) under one set of limits. Redis runs the script atomically, so
-- it reads, refills, decides and writes with nothing in between, whatever
-- the number of Sluice replicas. Groups are handled one after the other,
-- each reading its buckets as the groups before it left them. A group's
-- calls are decided in order, each all or nothing over every limit of
-- every bucket, each against the state the ones before it left, and its
-- buckets are written once at the end: this replica's concurrent
-- decisions cost one run, however many buckets they are on. The
-- arithmetic is backend/bucket's, step for step (Refill, Reconcile,
-- Decide, Refund); the Go side computes everything else (costs, TTLs,
-- waits) and a differential test holds the two equal.
--
-- Numbers are Lua doubles: every value stays below 2^53 (tokens below
-- 2^40 * 1000, times in epoch milliseconds), divisions are corrected to
-- exact integer quotients, and numbers are written with %.0f, never with
-- Lua's %.14g, which would round them. Consumption, which outgrows 2^53,
-- is summed here while that is exact, and by Redis's own 64-bit integers
-- (HINCRBY) past it.
--
-- Cost per group in the common case (the limits unchanged since the
-- bucket was written): one HMGET, one HSET and one PEXPIRE per bucket.
-- A bucket's cfg field holds the fingerprint of the limits it was written
-- under; only when it differs are the stored rates read and the fields of
-- removed limits dropped.
--
-- Most of a script's time goes to Lua's own work rather than to the
-- commands, so the sets of limits ("layouts") come once per run, however
-- many buckets share them, with their field names built once.
--
-- ARGV: now; the number of layouts, and per layout cfg (fingerprint of
-- its limits), n, and n times: name, amount, period, burst; the number of
-- groups, and per group: the number of its keys, per key its layout (an
-- index) and ttl (ms; 0 keeps the bucket forever); then the number of its
-- calls, and per call mode ("d" decide, "r" refund) and per key and limit
-- its cost (for a refund, what it gives back). Every amount in
-- millitokens, every time in milliseconds. KEYS: every group's keys, in
-- order.
--
-- Reply, per group: "ok", then per call allowed (1 or 0) and per key and
-- limit the tokens and clock after it, as integers; or, when a key
-- of the group holds something other than a hash, Redis's error, and the
-- group changes nothing (the other groups go on).

local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function cdiv(a, b)
  if a <= 0 then return 0 end
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

local function gcd(a, b)
  while b ~= 0 do
    a, b = b, math.fmod(a, b)
  end
  return a
end

-- bucket.Refill
local function refill(amount, period, burst, tk, rf, now)
  if tk >= burst then return burst, now end
  if tk < 0 then tk = 0 end
  if rf > now or amount == 0 then return tk, rf end
  local g = gcd(amount, period)
  local dt, da = period / g, amount / g
  local steps = fdiv(now - rf, dt)
  if steps >= cdiv(burst - tk, da) then return burst, now end
  return tk + steps * da, rf + steps * dt
end

local num = tonumber
local function str(n) return string.format('%.0f', n) end
local exact = 9007199254740992 -- 2^53

-- group decides one group's calls, from ARGV[at] and KEYS[key] on, into
-- reply, and returns where the next group starts.
local function group(now, layouts, at, key, reply)
  -- The group's limits, bucket after bucket: lims[j] is the j-th limit's
  -- layout entry, tks[j], rfs[j] and tcs[j] its state.
  local buckets, lims, tks, rfs, tcs = {}, {}, {}, {}, {}
  for k = 1, num(ARGV[at]) do
    local b = {key = KEYS[key], lay = layouts[num(ARGV[at + 1 + 2 * (k - 1)])],
      ttl = ARGV[at + 2 + 2 * (k - 1)], first = #lims}
    for _, l in ipairs(b.lay.limits) do lims[#lims + 1] = l end
    buckets[k] = b
    key = key + 1
  end
  at = at + 1 + 2 * #buckets
  local n, ncalls = #lims, num(ARGV[at])
  local calls = at + 1
  local nextGroup = calls + ncalls * (1 + n)

  -- Read and bring every limit to now: bucket.Reconcile (a kept limit
  -- refilled at its stored rate; a new one full), then bucket.Refill at
  -- the limit's rate, which caps a kept limit at its new burst. Under
  -- unchanged limits the two refills are one.
  for _, b in ipairs(buckets) do
    local lay = b.lay
    local st = redis.pcall('HMGET', b.key, unpack(lay.fields))
    if st.err then
      reply[#reply + 1] = st.err
      return nextGroup, key
    end
    b.stale = st[1] ~= lay.cfg
    local rates
    if b.stale and st[1] then
      rates = redis.call('HMGET', b.key, unpack(lay.rates))
    end
    for i, l in ipairs(lay.limits) do
      local j = b.first + i
      local tk, rf = num(st[3 * i - 1]), num(st[3 * i])
      tcs[j] = st[3 * i + 1]
      if tk and rf and b.stale then
        local ra, rp, bx
        if rates then ra, rp, bx = num(rates[3 * i - 2]), num(rates[3 * i - 1]), num(rates[3 * i]) end
        if ra and rp and bx then
          tk, rf = refill(ra, rp, bx, tk, rf, now)
        else
          tk = nil
        end
      end
      if tk and rf then
        tks[j], rfs[j] = refill(l.amount, l.period, l.burst, tk, rf, now)
      else
        tks[j], rfs[j] = l.burst, now
      end
    end
  end

  -- The calls, in order. A denial, and a check that costs nothing, change
  -- nothing: refill is exact, so what is not written is credited again
  -- later, and a group of nothing else writes nothing. Each limit sums
  -- what the allowed calls spent while the sum is exact; past 2^53 it
  -- keeps every cost for Redis to add (costs[j]).
  reply[#reply + 1] = 'ok'
  local write, spent, costs = false, {}, {}
  for j = 1, n do spent[j] = 0 end
  at = calls
  for _ = 1, ncalls do
    local allowed = true
    if ARGV[at] == 'r' then
      write = true
      for j, l in ipairs(lims) do
        tks[j] = math.min(l.burst, tks[j] + num(ARGV[at + j]))
        if tks[j] == l.burst then rfs[j] = now end
      end
    else
      for j = 1, n do
        if tks[j] < num(ARGV[at + j]) then allowed = false end
      end
      if allowed then
        for j = 1, n do
          local cost = num(ARGV[at + j])
          if cost > 0 then
            write = true
            tks[j] = tks[j] - cost
            if costs[j] then
              costs[j][#costs[j] + 1] = cost
            elseif spent[j] + cost < exact then
              spent[j] = spent[j] + cost
            else
              costs[j] = {spent[j], cost}
            end
          end
        end
      end
    end
    at = at + 1 + n
    -- Numbers: Redis answers them as integers, exact below 2^53.
    reply[#reply + 1] = allowed and 1 or 0
    for j = 1, n do
      reply[#reply + 1] = tks[j]
      reply[#reply + 1] = rfs[j]
    end
  end
  if not write then
    return nextGroup, key
  end

  for _, b in ipairs(buckets) do
    local lay = b.lay
    local set = {}
    if b.stale then
      -- The limits changed: drop the fields of those removed.
      for _, f in ipairs(redis.call('HKEYS', b.key)) do
        local prefix = string.match(f, '^(b_.*_)%a%a$')
        if prefix and not lay.keep[prefix] then redis.call('HDEL', b.key, f) end
      end
      set = {'cfg', lay.cfg}
    end
    local slow = false
    for i, l in ipairs(lay.limits) do
      local j, m = b.first + i, #set
      set[m + 1] = l.tk; set[m + 2] = str(tks[j])
      set[m + 3] = l.rf; set[m + 4] = str(rfs[j])
      if b.stale then
        set[m + 5] = l.f .. 'cp'; set[m + 6] = l.amountArg
        set[m + 7] = l.f .. 'ra'; set[m + 8] = l.amountArg
        set[m + 9] = l.f .. 'rp'; set[m + 10] = l.periodArg
        set[m + 11] = l.f .. 'bx'; set[m + 12] = l.burstArg
      end
      if spent[j] > 0 and not costs[j] then
        -- The consumed total, exact as a double below 2^53; past it (or
        -- when the stored one is not a plain count), Redis adds.
        local tc = 0
        if tcs[j] then tc = string.match(tcs[j], '^%d+$') and num(tcs[j]) end
        if tc and tc + spent[j] < exact then
          set[#set + 1] = l.tc; set[#set + 1] = str(tc + spent[j])
        else
          costs[j] = {spent[j]}
        end
      end
      slow = slow or costs[j]
    end
    redis.call('HSET', b.key, unpack(set))
    if slow then
      for i, l in ipairs(lay.limits) do
        -- Each cost on its own: a batch's sum may pass 2^63 where one
        -- cost does not. At 2^63 the count saturates, as bucket.Decide's
        -- does (HINCRBY refuses the overflow before it changes
        -- anything); a damaged count starts again rather than fail every
        -- decision.
        for _, cost in ipairs(costs[b.first + i] or {}) do
          local r = redis.pcall('HINCRBY', b.key, l.tc, str(cost))
          if type(r) == 'table' and r.err then
            local tc = str(cost)
            if string.find(r.err, 'overflow') then tc = '9223372036854775807' end
            redis.call('HSET', b.key, l.tc, tc)
          end
        end
      end
    end
    if b.ttl ~= '0' then
      redis.call('PEXPIRE', b.key, b.ttl)
    else
      redis.call('PERSIST', b.key)
    end
  end
  return nextGroup, key
end

-- The layouts, each with the fields a read fetches (cfg, then per limit
-- tk, rf, tc), those of its stored rates, and its limits' field prefixes.
local now = num(ARGV[1])
local layouts, at = {}, 3
for li = 1, num(ARGV[2]) do
  local lay = {cfg = ARGV[at], limits = {}, fields = {'cfg'}, rates = {}, keep = {}}
  at = at + 2
  for i = 1, num(ARGV[at - 1]) do
    local f = 'b_' .. ARGV[at] .. '_'
    local l = {f = f, tk = f .. 'tk', rf = f .. 'rf', tc = f .. 'tc',
      amount = num(ARGV[at + 1]), period = num(ARGV[at + 2]), burst = num(ARGV[at + 3]),
      amountArg = ARGV[at + 1], periodArg = ARGV[at + 2], burstArg = ARGV[at + 3]}
    lay.limits[i] = l
    lay.fields[#lay.fields + 1] = l.tk
    lay.fields[#lay.fields + 1] = l.rf
    lay.fields[#lay.fields + 1] = l.tc
    lay.rates[#lay.rates + 1] = f .. 'ra'
    lay.rates[#lay.rates + 1] = f .. 'rp'
    lay.rates[#lay.rates + 1] = f .. 'bx'
    lay.keep[f] = true
    at = at + 4
  end
  layouts[li] = lay
end

local key, reply = 1, {}
at = at + 1
for _ = 1, num(ARGV[at - 1]) do
  at, key = group(now, layouts, at, key, reply)
end
return reply
