-- admit.lua: one admission, all-or-nothing, on Redis TIME.
--
-- KEYS: 1 leases (zset id -> expiry us), 2 requests TAT, 3 tokens TAT,
--       4 input-tokens TAT, 5 output-tokens TAT, 6 admission record,
--       7 scope epoch (the time, Redis us, from which the scope admits).
-- ARGV: 1 id, 2 lease TTL us, 3 record TTL ms, 4 max concurrency (0 = none),
--       5/6 requests rate per minute/burst, 7/8 tokens, 9/10 input tokens,
--       11/12 output tokens (rate 0 = none), 13 charged input,
--       14 charged output, 15 enforce (1) or shadow (0), 16 deadline in
--       Redis µs (0 = none): an admission that reaches Redis after it (its
--       caller gave up and decided without it) writes nothing,
--       17 epoch grace us, 18 epoch key TTL ms, 19 restart window s: a
--       missing epoch on a Redis whose uptime is at most this is treated as
--       lost data (grace), on an older one as a new scope (no grace).
-- Returns: {status, reason, wait us, in-flight, now us,
--           requests TAT, tokens TAT, input TAT, output TAT,
--           charged input, charged output, epoch}
-- status: 0 refused, 1 admitted, 2 already admitted (retried id),
--         3 admitted in shadow mode although the limits refused,
--         4 abandoned: the client gave up on this id (nothing written),
--         5 expired: Redis ran it after its deadline (nothing written),
--         6 epoch not ready: the scope's epoch key was missing and Redis
--           started within the restart window (it may have restarted
--           empty): the key now holds now + grace, and no
--           admission is made before then, so that every node holding
--           leases in the scope sees the new epoch and re-asserts them
--           first. wait is the time left.
-- reason: 0 none, 1 concurrency, 2 requests, 3 tokens, 4 input, 5 output.
-- A TAT at or before now (or 0) means a full bucket.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id = ARGV[1]
local ttl = tonumber(ARGV[2])
local maxc = tonumber(ARGV[4])
local deadline = tonumber(ARGV[16] or '0')
if deadline > 0 and now > deadline then
  return {5, 0, 0, 0, now, 0, 0, 0, 0, 0, 0, 0}
end
local epoch = tonumber(redis.call('GET', KEYS[7]) or '0')
if epoch == 0 then
  -- No epoch: a new scope, or Redis lost its data. Only a Redis process
  -- younger than the restart window can have lost leases that nodes still
  -- hold (every live node re-asserts its leases within the window); on an
  -- older one the scope is new and admits at once.
  epoch = now
  local up = string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')
  if tonumber(up or '0') <= tonumber(ARGV[19] or '0') then
    epoch = now + tonumber(ARGV[17])
  end
  redis.call('SET', KEYS[7], string.format('%.0f', epoch), 'PX', ARGV[18])
end
if now < epoch then
  return {6, 0, epoch - now, 0, now, 0, 0, 0, 0, 0, 0, epoch}
end

local function tat_of(key)
  return tonumber(redis.call('GET', key) or '0')
end

local function store(key, tat)
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.17g', tat),
      'PX', math.ceil((tat - now) / 1000) + 1)
  end
end

local function keep_leases()
  local want = math.ceil(ttl / 1000) + 1000
  if redis.call('PTTL', KEYS[1]) < want then
    redis.call('PEXPIRE', KEYS[1], want)
  end
end

-- TATs of the configured buckets (0 for the others: never read or written).
local tats = {0, 0, 0, 0}
for i = 1, 4 do
  if tonumber(ARGV[3 + 2 * i]) > 0 then tats[i] = tat_of(KEYS[1 + i]) end
end

-- A retried admission of a live request is charged once.
local rec = redis.call('GET', KEYS[6])
if rec == 'x' then
  return {4, 0, 0, 0, now, 0, 0, 0, 0, 0, 0, epoch}
end
if rec and rec ~= 's' then
  local ci, co = string.match(rec, '^(%-?%d+) (%-?%d+)$')
  redis.call('ZADD', KEYS[1], now + ttl, id)
  keep_leases()
  local n = redis.call('ZCOUNT', KEYS[1], string.format('(%.0f', now), '+inf')
  return {2, 0, 0, n, now, tats[1], tats[2], tats[3], tats[4], tonumber(ci), tonumber(co), epoch}
end

local ci, co = tonumber(ARGV[13]), tonumber(ARGV[14])
local costs = {1, ci + co, ci, co}
local reason, wait = 0, 0
local function refuse(r, w)
  if reason == 0 or w > wait then reason, wait = r, w end
end

local inflight = redis.call('ZCOUNT', KEYS[1], string.format('(%.0f', now), '+inf')
if maxc > 0 and inflight >= maxc then refuse(1, 1000000) end

-- GCRA: T = 60 s / rate, tau = burst * T; admit iff max(tat, now) + n*T - now <= tau.
local newtats = {}
for i = 1, 4 do
  local rate, burst = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  newtats[i] = tats[i]
  if rate > 0 then
    local T = 60000000 / rate
    local tau = burst * T
    local nt = math.max(tats[i], now) + costs[i] * T
    local over = nt - now - tau
    if over > tau * 1e-9 then refuse(i + 1, over) end
    newtats[i] = nt
  end
end

local status = 1
if reason ~= 0 then
  if ARGV[15] == '1' then
    return {0, reason, math.ceil(wait), inflight, now, tats[1], tats[2], tats[3], tats[4], ci, co, epoch}
  end
  status = 3
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, id)
keep_leases()
for i = 1, 4 do
  if newtats[i] ~= tats[i] then store(KEYS[1 + i], newtats[i]) end
end
redis.call('SET', KEYS[6], ci .. ' ' .. co, 'PX', ARGV[3])
return {status, reason, math.ceil(wait), inflight + 1, now,
  newtats[1], newtats[2], newtats[3], newtats[4], ci, co, epoch}
