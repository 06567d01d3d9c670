-- Applies one or more decisions, in order, each on its own key (a key may repeat).
--
-- KEYS[i]   the i-th decision's Redis key; or only the first decision's key, when the
--           keys are listed in ARGV (a cluster batch over several slots of one node).
-- ARGV[1]   now in µs since the Unix epoch, or '' to read the server's TIME.
-- ARGV[2]   milliseconds added to every key's time-to-live (0 when time is the server's).
-- ARGV[3]   k: 0 when the keys are KEYS; otherwise k keys follow, the i-th decision's
--           first. Then the number of distinct policies m, and m times: algorithm, the
--           number of parameters n, and the n parameters.
-- then per decision, five values: its policy's number (1 to m), op, cost, and max_wait as
-- whole seconds and the nanoseconds beyond them ('' and '' for none).
--
-- Returns four values per decision: allowed (1 or 0), delay, remaining, and reset_after;
-- the times in nanoseconds, rounded as Rust's `micros_to_duration` rounds (an integer, or
-- beyond 2^62 ns a float in a string).
--
-- A key holds the record `PL.pack` writes (see the prelude). As in the memory store, a
-- record another algorithm wrote is idle to this one, and a record is idle once it expired.
local now = PL.clock(ARGV[1])
local slack = tonumber(ARGV[2])

-- Read and check every policy and decision before touching any key, so a malformed call
-- changes nothing.
local keys = KEYS
local a = 4
local listed = tonumber(ARGV[3])
if listed > 0 then
  keys = {}
  for i = 1, listed do
    keys[i] = ARGV[3 + i]
  end
  a = 4 + listed
end
local policies = {}
local m = tonumber(ARGV[a])
a = a + 1
for i = 1, m do
  local alg = ARGV[a]
  local f = PL.alg[alg]
  if not f then
    return redis.error_reply('paceline: unknown algorithm ' .. tostring(alg))
  end
  local n = tonumber(ARGV[a + 1])
  local p = {}
  for j = 1, n do
    p[j] = tonumber(ARGV[a + 1 + j])
  end
  policies[i] = { alg = alg, f = f, p = p }
  a = a + 2 + n
end
local first = a
for i = 1, #keys do
  local b = first + (i - 1) * 5
  local op = ARGV[b + 1]
  if not policies[tonumber(ARGV[b])] then
    return redis.error_reply('paceline: no policy ' .. tostring(ARGV[b]))
  end
  if op ~= 'pace' and op ~= 'limit' and op ~= 'peek' then
    return redis.error_reply('paceline: unknown op ' .. tostring(op))
  end
end

-- Read every key before writing any: a key this node does not serve fails the call here,
-- with nothing changed. Later decisions on a key see the earlier ones' writes.
local records = {}
for i = 1, #keys do
  local key = keys[i]
  if records[key] == nil then
    records[key] = redis.call('GET', key)
  end
end

local out = {}
for i = 1, #keys do
  local b = first + (i - 1) * 5
  local key = keys[i]
  local policy = policies[tonumber(ARGV[b])]
  local alg = policy.alg
  local op, cost = ARGV[b + 1], tonumber(ARGV[b + 2])
  local max_wait, max_wait_us = PL.max_wait(ARGV[b + 3], ARGV[b + 4])
  local state, old_exp
  local raw = records[key]
  if raw then
    local old_alg, exp, s = PL.unpack(raw)
    if old_alg == alg and exp > now then
      state, old_exp = s, exp
    end
  end
  local allowed, delay, remaining, reset_after, new_state, idle_at =
    policy.f(policy.p, state, now, op, cost, max_wait, max_wait_us)
  local written = PL.save(key, alg, state, old_exp, new_state, reset_after, idle_at, now, slack)
  if written ~= nil then
    records[key] = written
  end
  out[#out + 1] = allowed and 1 or 0
  out[#out + 1] = PL.nanos(delay)
  out[#out + 1] = remaining
  out[#out + 1] = PL.nanos(reset_after)
end
return out
