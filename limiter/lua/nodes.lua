-- nodes.lua: register this edge node and count the live ones.
--
-- KEYS: 1 node set (zset node id -> last heartbeat us).
-- ARGV: 1 node id, 2 staleness us (a node unseen for longer is gone).
-- Returns the number of live nodes.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local stale = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - stale)
redis.call('PEXPIRE', KEYS[1], math.ceil(stale / 1000) + 1000)
return redis.call('ZCARD', KEYS[1])
