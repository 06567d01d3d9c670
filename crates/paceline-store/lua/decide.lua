-- Applies one or more decisions, in order, each on its own key (a key may repeat). The
-- arguments are those `PL.read_batch` reads (see the prelude).
--
-- Returns five values per decision: allowed (1 or 0), delay, remaining, reset_after, and
-- the lease a `concurrency` decision took (-1: none); the times in nanoseconds, rounded as
-- Rust's `micros_to_duration` rounds (an integer, or beyond 2^62 ns a float in a string).
--
-- A key holds the record `PL.pack` writes (see the prelude). As in the memory store, a
-- record another algorithm wrote is idle to this one, and a record is idle once it expired.
local refused, now, slack, keys, runs, records = PL.open_batch(KEYS, ARGV)
if refused then
  return refused
end
-- Later decisions on a key see the earlier ones' writes (in `records`).

local out = {}
local i = 0
for r = 1, #runs do
  local run = runs[r]
  local policy = run.policy
  local alg, f, p = policy.alg, policy.f, policy.p
  local op, cost, max_wait, max_wait_us = run.op, run.cost, run.max_wait, run.max_wait_us
  for _ = 1, run.count do
    i = i + 1
    local key = keys[i]
    local state, old_exp
    local raw = records[key]
    if raw then
      local old_alg, exp, s = PL.unpack(raw)
      if old_alg == alg and exp > now then
        state, old_exp = s, exp
      end
    end
    local allowed, delay, remaining, reset_after, new_state, idle_at, lease =
      f(p, state, now, op, cost, max_wait, max_wait_us)
    local written = PL.save(key, alg, state, old_exp, new_state, reset_after, idle_at, now, slack)
    if written ~= nil then
      records[key] = written
    end
    PL.reply(out, allowed, delay, remaining, reset_after, lease)
  end
end
return out
