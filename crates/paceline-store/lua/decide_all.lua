-- Decides a set of limits as one: the arguments of `decide.lua` (`PL.read_batch` in the
-- prelude), each key named once; the keys are declared, so in a cluster they share a slot.
--
-- Every decision is first made on the keys' records as read, without writing anything. If
-- every limit admits, the decisions are applied and saved exactly as `decide.lua` does;
-- otherwise nothing is written and each limit answers a `peek` of its record as read.
--
-- Returns 1 (admitted and saved) or 0 (refused, nothing changed), then five values per
-- limit as `decide.lua` returns them: allowed, delay, remaining, reset_after, lease.
local refused, now, slack, keys, runs, records = PL.open_batch(KEYS, ARGV)
if refused then
  return refused
end

-- The key's live state under `alg` as read (a fresh table each time: an algorithm may
-- change the table it is given), and its expiry.
local function live(key, alg)
  local raw = records[key]
  if raw then
    local old_alg, exp, s = PL.unpack(raw)
    if old_alg == alg and exp > now then
      return s, exp
    end
  end
  return nil, nil
end

-- Calls `each(run, key)` for every decision, in order.
local function every(each)
  local i = 0
  for r = 1, #runs do
    local run = runs[r]
    for _ = 1, run.count do
      i = i + 1
      each(run, keys[i])
    end
  end
end

local admitted = true
every(function(run, key)
  local policy = run.policy
  if admitted then
    admitted = policy.f(policy.p, live(key, policy.alg), now, run.op, run.cost, run.max_wait,
      run.max_wait_us)
  end
end)

local out = { admitted and 1 or 0 }
local function reply(allowed, delay, remaining, reset_after, lease)
  out[#out + 1] = allowed and 1 or 0
  out[#out + 1] = PL.nanos(delay)
  out[#out + 1] = remaining
  out[#out + 1] = PL.nanos(reset_after)
  out[#out + 1] = lease or -1
end

if admitted then
  every(function(run, key)
    local policy = run.policy
    local state, old_exp = live(key, policy.alg)
    local allowed, delay, remaining, reset_after, new_state, idle_at, lease =
      policy.f(policy.p, state, now, run.op, run.cost, run.max_wait, run.max_wait_us)
    PL.save(key, policy.alg, state, old_exp, new_state, reset_after, idle_at, now, slack)
    reply(allowed, delay, remaining, reset_after, lease)
  end)
else
  every(function(run, key)
    local policy = run.policy
    local state = live(key, policy.alg)
    local allowed, delay, remaining, reset_after =
      policy.f(policy.p, state, now, 'peek', run.cost, nil, nil)
    reply(allowed, delay, remaining, reset_after)
  end)
end
return out
