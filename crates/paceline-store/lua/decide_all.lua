-- Decides a set of limits as one: the arguments of `decide.lua` (`PL.read_batch` in the
-- prelude), each key named once; the keys are declared, so in a cluster they share a slot.
--
-- Every decision is first made on the keys' records as read, without writing anything. If
-- every limit admits, the decisions are applied and saved exactly as `decide.lua` does;
-- otherwise nothing is written and each limit answers a `peek` of its record as read.
--
-- A `pace` set of several limits books the earliest time at which every limit admits: each
-- limit's earliest slot at or after a time, from now, then from the latest of those, until
-- they meet (64 rounds at most: else the reply is { -1 }).
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

local out = {}
local function reply(allowed, delay, remaining, reset_after, lease)
  out[#out + 1] = allowed and 1 or 0
  out[#out + 1] = PL.nanos(delay)
  out[#out + 1] = remaining
  out[#out + 1] = PL.nanos(reset_after)
  out[#out + 1] = lease or -1
end

-- A `pace` set books the earliest time at which every limit admits (Rust's `set::meeting`).
if #keys > 1 and runs[1].op == 'pace' then
  -- The algorithms that book a later slot by deciding as of it (their state is a schedule),
  -- and the others, which take the slot's earliest time as an argument. (Rust refuses a
  -- set holding any other before it calls.)
  local as_of = { gcra = true, smooth_bursty = true, smooth_warming_up = true }
  -- Rust's `Policy::pace_from`: the time the values are counted from, then the values.
  local function pace_from(run, state, from)
    local policy = run.policy
    if as_of[policy.alg] then
      return from, policy.f(policy.p, state, from, 'pace', run.cost, nil, nil)
    end
    return now, policy.f(policy.p, state, now, 'pace', run.cost, nil, nil, from)
  end
  -- A time counted from `base` in nanoseconds counted from now (Rust adds the whole µs
  -- between to the rounded nanoseconds).
  local function from_now(base, us)
    return PL.nanos(us) + (base - now) * 1000
  end
  local slot, alone, binding = now, nil, {}
  local met = false
  for round = 1, 64 do
    local slots, decided = {}, {}
    local i = 0
    every(function(run, key)
      i = i + 1
      local base, _, delay, remaining, reset_after = pace_from(run, live(key, run.policy.alg), slot)
      slots[i] = PL.expiry(base, delay)
      decided[i] = { base, delay, remaining, reset_after }
    end)
    if round == 1 then
      alone = decided
    end
    local next = slot
    for k = 1, #slots do
      if slots[k] > next then
        next = slots[k]
      end
    end
    if next == slot then
      met = true
      break
    end
    binding = {}
    for k = 1, #slots do
      binding[k] = slots[k] == next
    end
    slot = next
  end
  if not met then
    return { -1 }
  end
  local max_wait = runs[1].max_wait
  if max_wait and slot - now > max_wait then
    -- Refused, nothing written: each limit's own pace from now; those that set the slot
    -- refuse with the set's retry-after.
    out[1] = 0
    local retry = PL.retry_after_max_wait(slot - now, max_wait)
    for k = 1, #alone do
      local base, delay, remaining, reset_after = alone[k][1], alone[k][2], alone[k][3], alone[k][4]
      out[#out + 1] = binding[k] and 0 or 1
      out[#out + 1] = binding[k] and PL.nanos(retry) or from_now(base, delay)
      out[#out + 1] = remaining
      out[#out + 1] = from_now(base, reset_after)
      out[#out + 1] = -1
    end
    return out
  end
  out[1] = 1
  every(function(run, key)
    local policy = run.policy
    local state, old_exp = live(key, policy.alg)
    local base, _, delay, remaining, reset_after, new_state, idle_at = pace_from(run, state, slot)
    -- The expiry counted from `base`, as the values are; the time to live from now.
    local exp = PL.next_expiry(base, reset_after, old_exp, idle_at, new_state ~= nil)
    if exp then
      PL.put(key, PL.pack(policy.alg, exp, new_state or state), exp, now, slack)
    end
    out[#out + 1] = 1
    out[#out + 1] = from_now(base, delay)
    out[#out + 1] = remaining
    out[#out + 1] = from_now(base, reset_after)
    out[#out + 1] = -1
  end)
  return out
end

local admitted = true
every(function(run, key)
  local policy = run.policy
  if admitted then
    admitted = policy.f(policy.p, live(key, policy.alg), now, run.op, run.cost, run.max_wait,
      run.max_wait_us)
  end
end)

out[1] = admitted and 1 or 0

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
