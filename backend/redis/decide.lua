-- A batch of decisions (and refunds) against the buckets KEYS name: a
-- bucket, and its parent's in a cascade. Redis runs the script
-- atomically, so it reads, refills, decides and writes with nothing in
-- between, whatever the number of Sluice replicas. The calls of a batch
-- are decided one after the other, each all or nothing over every limit
-- of every bucket, each against the state the ones before it left, and
-- the buckets are written once at the end: a hot bucket's concurrent
-- decisions on one replica cost one run. The arithmetic is
-- backend/bucket's, step for step (Refill, Reconcile, Decide, Refund); the
-- Go side computes everything else (costs, TTLs, waits) and a
-- differential test holds the two equal.
--
-- Numbers are Lua doubles: every value stays below 2^53 (tokens below
-- 2^40 * 1000, times in epoch milliseconds), divisions are corrected to
-- exact integer quotients, and numbers are written with %.0f, never with
-- Lua's %.14g, which would round them. Consumption, which outgrows 2^53,
-- is counted by Redis in its own 64-bit integers.
--
-- ARGV: now, the number of calls, then per key: ttl (ms; 0 keeps the
-- bucket forever), cfg (fingerprint of the limits), n, and n times: name,
-- amount, period, burst; then per call: mode ("d" decide, "r" refund) and
-- per key and limit its cost (for a refund, what it gives back). Every
-- amount in millitokens, every time in milliseconds.
--
-- Reply: per call, allowed (1 or 0) and per key and limit the tokens and
-- clock after it; then per key and limit the consumed total after the
-- batch; all as decimal strings.

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

local function num(s) return tonumber(s) end
local function str(n) return string.format('%.0f', n) end
local function field(name, f) return 'b_' .. name .. '_' .. f end

local now = num(ARGV[1])
local ncalls = num(ARGV[2])
local buckets, all = {}, {}
local at = 3
for k = 1, #KEYS do
  local b = {key = KEYS[k], ttl = num(ARGV[at]), cfg = ARGV[at + 1], limits = {}}
  local n = num(ARGV[at + 2])
  at = at + 3
  for i = 1, n do
    local l = {name = ARGV[at], amount = num(ARGV[at + 1]), period = num(ARGV[at + 2]),
      burst = num(ARGV[at + 3]), spent = 0}
    b.limits[i] = l
    table.insert(all, l)
    at = at + 4
  end
  buckets[k] = b
end

-- Read and bring every limit to now: bucket.Reconcile (a kept limit
-- refilled at its stored rate; a new one full), then bucket.Refill at the
-- limit's rate, which caps a kept limit at its new burst.
for _, b in ipairs(buckets) do
  b.stale = redis.call('HGET', b.key, 'cfg') ~= b.cfg
  for _, l in ipairs(b.limits) do
    local st = redis.call('HMGET', b.key, field(l.name, 'tk'), field(l.name, 'rf'),
      field(l.name, 'ra'), field(l.name, 'rp'), field(l.name, 'bx'))
    local tk, rf
    if st[1] and st[2] and st[3] and st[4] and st[5] then
      tk, rf = refill(num(st[3]), num(st[4]), num(st[5]), num(st[1]), num(st[2]), now)
    else
      tk, rf = l.burst, now
    end
    l.tk, l.rf = refill(l.amount, l.period, l.burst, tk, rf, now)
  end
end

-- The calls, in order. A denial, and a check that costs nothing, change
-- nothing: refill is exact, so what is not written is credited again
-- later, and a batch of nothing else writes nothing.
local reply, write = {}, false
for _ = 1, ncalls do
  local refund = ARGV[at] == 'r'
  local costs = {}
  for i = 1, #all do costs[i] = num(ARGV[at + i]) end
  at = at + 1 + #all
  local allowed = true
  if refund then
    write = true
    for i, l in ipairs(all) do
      l.tk = math.min(l.burst, l.tk + costs[i])
      if l.tk == l.burst then l.rf = now end
    end
  else
    for i, l in ipairs(all) do
      if l.tk < costs[i] then allowed = false end
    end
    if allowed then
      for i, l in ipairs(all) do
        if costs[i] > 0 then
          write = true
          l.tk = l.tk - costs[i]
          table.insert(l, costs[i]) -- counted in Redis below
        end
      end
    end
  end
  table.insert(reply, allowed and '1' or '0')
  for _, l in ipairs(all) do
    table.insert(reply, str(l.tk))
    table.insert(reply, str(l.rf))
  end
end

if write then
  for _, b in ipairs(buckets) do
    if b.stale then
      -- The limits changed: drop the fields of those removed.
      local keep = {}
      for _, l in ipairs(b.limits) do keep[l.name] = true end
      for _, f in ipairs(redis.call('HKEYS', b.key)) do
        local name = string.match(f, '^b_(.*)_%a%a$')
        if name and not keep[name] then redis.call('HDEL', b.key, f) end
      end
    end
    local set = {'cfg', b.cfg}
    for _, l in ipairs(b.limits) do
      table.insert(set, field(l.name, 'tk')); table.insert(set, str(l.tk))
      table.insert(set, field(l.name, 'rf')); table.insert(set, str(l.rf))
      table.insert(set, field(l.name, 'cp')); table.insert(set, str(l.amount))
      table.insert(set, field(l.name, 'ra')); table.insert(set, str(l.amount))
      table.insert(set, field(l.name, 'rp')); table.insert(set, str(l.period))
      table.insert(set, field(l.name, 'bx')); table.insert(set, str(l.burst))
    end
    redis.call('HSET', b.key, unpack(set))
    for _, l in ipairs(b.limits) do
      -- Each call's cost on its own: a batch's sum may pass 2^53. At
      -- 2^63 the count saturates, as bucket.Decide's does (HINCRBY
      -- refuses the overflow before it changes anything); a damaged
      -- count starts again rather than fail every decision.
      for _, cost in ipairs(l) do
        local r = redis.pcall('HINCRBY', b.key, field(l.name, 'tc'), str(cost))
        if type(r) == 'table' and r.err then
          local tc = str(cost)
          if string.find(r.err, 'overflow') then tc = '9223372036854775807' end
          redis.call('HSET', b.key, field(l.name, 'tc'), tc)
        end
      end
    end
    if b.ttl > 0 then
      redis.call('PEXPIRE', b.key, str(b.ttl))
    else
      redis.call('PERSIST', b.key)
    end
  end
end

-- Read back as strings: an integer reply would become a Lua double.
for _, b in ipairs(buckets) do
  for _, l in ipairs(b.limits) do
    table.insert(reply, redis.call('HGET', b.key, field(l.name, 'tc')) or '0')
  end
end
return reply
