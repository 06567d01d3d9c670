-- Decides a set of limits as one: the arguments of `decide.lua` (`PL.read_batch` in the
-- prelude), each key named once; the keys are declared, so in a cluster they share a slot.
--
-- Every decision is first made on the keys' records as read, without writing anything. If
-- every limit admits, the decisions are applied and saved exactly as `decide.lua` does;
-- otherwise nothing is written and each limit answers a `peek` of its record as read.
--
-- A `pace` set of several limits books the earliest time at which every limit admits: each
-- limit's earliest slot at or after a time, from now, then from the latest of those, until
-- they meet (64 rounds at most, and 2^53 ns from now: else the reply is { -1 }). A limit
-- refusing to book its slot (past its horizon) refuses the set, nothing written.
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
  PL.reply(out, allowed, delay, remaining, reset_after, lease)
end

-- A `pace` set books the earliest time at which every limit admits (Rust's `set::meeting`).
if #keys > 1 and runs[1].op == 'pace' then
  -- The algorithms that book a later slot by deciding as of it (their state is a schedule),
  -- and the others, which take the slot's earliest time as an argument. (Rust refuses a
  -- set holding any other before it calls.)
  local as_of = { gcra = true, smooth_bursty = true, smooth_warming_up = true }
  -- Rust's `Policy::pace_from`: the time the values are counted from, then the values
  -- (`remaining` the key's at now: a peek of cost 1 on the new state, for those decided as
  -- of the slot).
  local function pace_from(run, state, from)
    local policy = run.policy
    if as_of[policy.alg] then
      local allowed, delay, _, reset_after, new_state, idle_at =
        policy.f(policy.p, state, from, 'pace', run.cost, nil, nil)
      local _, _, remaining = policy.f(policy.p, new_state, now, 'peek', 1, nil, nil)
      return from, allowed, delay, remaining, reset_after, new_state, idle_at
    end
    return now, policy.f(policy.p, state, now, 'pace', run.cost, nil, nil, from)
  end
  -- The decimal digits of `a + b`, two whole numbers written in digits.
  local function add_digits(a, b)
    local sum, carry = {}, 0
    local i, j = #a, #b
    while i > 0 or j > 0 or carry > 0 do
      local d = carry
      if i > 0 then
        d = d + string.byte(a, i) - 48
        i = i - 1
      end
      if j > 0 then
        d = d + string.byte(b, j) - 48
        j = j - 1
      end
      carry = d >= 10 and 1 or 0
      sum[#sum + 1] = string.char(48 + d % 10)
    end
    return string.reverse(table.concat(sum))
  end
  -- A time counted from `base` in nanoseconds counted from now, exactly as Rust adds the
  -- whole nanoseconds between (an integer) to the rounded nanoseconds (a double's value):
  -- a sum past 2^53 is written in digits.
  local function from_now(base, us)
    local ns = PL.nanos(us)
    if base == now or type(ns) ~= 'number' then
      return ns
    end
    local between = (base - now) * 1000
    local total = ns + between
    if total < 9007199254740992 then
      return total
    end
    -- The µs between are a whole number below 2^53: in digits, times 1000 exactly.
    return add_digits(string.format('%.0f', ns), string.format('%.0f', base - now) .. '000')
  end
  local slot, binding = now, {}
  local met = false
  -- The longest retry-after of the limits that refuse to book past their horizon (the window
  -- algorithms' `MAX_BOOKED_WINDOWS`), if any does: the set is refused.
  local past
  for _ = 1, 64 do
    local slots, refusing = {}, {}
    local i = 0
    every(function(run, key)
      i = i + 1
      local base, allowed, delay = pace_from(run, live(key, run.policy.alg), slot)
      if allowed then
        slots[i] = PL.expiry(base, delay)
      else
        slots[i] = slot
        refusing[i] = true
        if not past or delay > past then
          past = delay
        end
      end
    end)
    if past then
      binding = refusing
      break
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
    if next - now > 9007199254740 or next > 9007199254740992 then
      -- More than 2^53 ns away, or past the last time the engine takes (2^53 µs): no
      -- slot, as in Rust (`MAX_PACE_SET_DELAY_US`).
      break
    end
    binding = {}
    for k = 1, #slots do
      binding[k] = slots[k] == next
    end
    slot = next
  end
  local max_wait = runs[1].max_wait
  -- Refused past a horizon (`past`), or beyond max_wait: the later of the two, as a single
  -- pace answers (past a horizon, `slot` is where the rounds had got to).
  local retry = past
  if not retry and not met then
    return { -1 }
  end
  if max_wait and slot - now > max_wait then
    local waited = PL.retry_after_max_wait(slot - now, max_wait)
    if not retry or waited > retry then
      retry = waited
    end
  end
  if retry then
    -- Refused, nothing written: each limit answers as it would alone (its own pace with
    -- max_wait); those that set the slot (or refused it, past their horizon) refuse with the
    -- set's retry-after.
    out[1] = 0
    local k = 0
    every(function(run, key)
      k = k + 1
      local policy = run.policy
      local allowed, delay, remaining, reset_after = policy.f(policy.p, live(key, policy.alg), now,
        'pace', run.cost, run.max_wait, run.max_wait_us)
      if binding[k] then
        allowed, delay = false, retry
      end
      reply(allowed, delay, remaining, reset_after)
    end)
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
