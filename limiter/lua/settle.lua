-- settle.lua: apply actual - charged and release the lease, once; or
-- abandon an admission whose answer the client never saw.
--
-- KEYS: 1 leases, 2 tokens TAT, 3 input-tokens TAT, 4 output-tokens TAT,
--       5 admission record, 6 requests TAT.
-- ARGV: 1 id, 2 settled-record TTL ms, 3/4/5 tokens/input/output rate per
--       minute (0 = none), 6/7/8 tokens/input/output delta (actual - charged),
--       9 mode: "settle" or "abandon", 10 requests rate per minute,
--       11/12/13 tokens/input/output burst, 14 "resend" (optional).
-- Returns 1 when applied, 0 when there was nothing to do.
--
-- Idempotent: the first run marks the record settled "s"; any later run
-- with the same id (a retry, a resend) finds "s" or "x" and changes
-- nothing, neither the lease nor the buckets. A resend (after a Redis
-- master change, resettle.go) applies only to an admission record still
-- there and unsettled: without a record the admission was lost with the
-- old master too, and there is nothing to give back.
--
-- A positive delta is debt, bounded at one burst below empty (the TAT at
-- most now + 2 * burst * T; one already beyond, from shadow mode, stays);
-- a negative one
-- is a refund that never moves the TAT before now (never beyond the burst).
-- Abandon takes back the whole admission (request and charge, from the
-- record); when the admission has not run yet it leaves a tombstone "x" so
-- that a late admission with this id is not applied.

local rec = redis.call('GET', KEYS[5])
if rec == 's' or rec == 'x' then return 0 end
local abandon = ARGV[9] == 'abandon'
if not rec and ARGV[14] == 'resend' and not abandon then return 0 end
if abandon and not rec then
  redis.call('SET', KEYS[5], 'x', 'PX', ARGV[2])
  return 0
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function adjust(key, rate, d, burst)
  if rate <= 0 or d == 0 then return end
  local T = 60000000 / rate
  local tat = tonumber(redis.call('GET', key) or '0')
  if d > 0 then
    -- Debt: at most one burst below empty (maxDebt in gcra.go), and
    -- never beyond ~115 days so the TAT and its expiry stay representable.
    local limit = math.min(now + 2 * (burst or 0) * T, now + 1e13)
    tat = math.min(math.max(tat, now) + d * T, math.max(tat, limit))
  else
    tat = math.max(tat + d * T, now)
  end
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.17g', tat),
      'PX', math.ceil((tat - now) / 1000) + 1)
  end
end

local deltas = {tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])}
if abandon then
  local ci, co = string.match(rec, '^(%-?%d+) (%-?%d+)$')
  ci, co = tonumber(ci) or 0, tonumber(co) or 0
  deltas = {-(ci + co), -ci, -co}
  adjust(KEYS[6], tonumber(ARGV[10]), -1, 0)
end
redis.call('ZREM', KEYS[1], ARGV[1])
for i = 1, 3 do
  adjust(KEYS[1 + i], tonumber(ARGV[2 + i]), deltas[i], tonumber(ARGV[10 + i]))
end
redis.call('SET', KEYS[5], 's', 'PX', ARGV[2])
return 1
