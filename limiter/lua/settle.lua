-- settle.lua: apply actual - charged and release the lease, once.
--
-- KEYS: 1 leases, 2 tokens TAT, 3 input-tokens TAT, 4 output-tokens TAT,
--       5 admission record.
-- ARGV: 1 id, 2 settled-record TTL ms, 3/4/5 tokens/input/output rate per
--       minute (0 = none), 6/7/8 tokens/input/output delta (actual - charged).
-- Returns 1 when applied, 0 when the request was already settled.
-- A positive delta is debt (the TAT moves on without bound); a negative one
-- is a refund that never moves the TAT before now (never beyond the burst).

if redis.call('GET', KEYS[5]) == 's' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

redis.call('ZREM', KEYS[1], ARGV[1])
for i = 1, 3 do
  local rate, d = tonumber(ARGV[2 + i]), tonumber(ARGV[5 + i])
  if rate > 0 and d ~= 0 then
    local key = KEYS[1 + i]
    local T = 60000000 / rate
    local tat = tonumber(redis.call('GET', key) or '0')
    if d > 0 then
      tat = math.max(tat, now) + d * T
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
end
redis.call('SET', KEYS[5], 's', 'PX', ARGV[2])
return 1
