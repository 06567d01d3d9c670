-- paceline's Lua library: the helpers every algorithm twin shares.
--
-- Each algorithm file adds one function to `PL.alg`:
--
--   PL.alg[name] = function(p, s, now, op, cost, max_wait, max_wait_us)
--     -> allowed (boolean), delay (µs), remaining (count), reset_after (µs), new_state,
--        idle_at (optional)
--
-- `p` holds the policy's parameters (numbers, in the order the Rust store sends them), `s`
-- the key's state table or nil when the key is idle, `now` the time in microseconds since
-- the Unix epoch, `op` one of 'pace', 'limit', 'peek', `cost` a positive integer and
-- `max_wait` the longest acceptable delay of a `pace` in µs (nil: any; `max_wait_us` is the
-- same in whole µs, rounded down, for twins of Rust code that uses `Duration::as_micros`).
-- `new_state` is the state to store, or nil when the request changes nothing. `idle_at`,
-- given with a new state by an algorithm whose state has no expiry of its own (`gcra`), is
-- the time in µs from which that state is idle: its record lives at least until then.
-- Every twin repeats the float operations of its Rust original in the same order, so both
-- give bit-identical results: Redis's Lua numbers are IEEE doubles like Rust's f64.
local PL = { alg = {} }

-- Rust's `util::floor_count`: a non-negative count, truncated.
function PL.floor_count(x)
  if x ~= x or x <= 0 then
    return 0
  end
  return math.floor(x)
end

-- Rust's `util::retry_after_max_wait`.
function PL.retry_after_max_wait(delay, max_wait)
  return math.max(delay - max_wait, 0)
end

-- Rust's `micros_to_duration`, in nanoseconds: negative and NaN are 0, the rest rounds
-- half up.
local function round_nanos(us)
  if us ~= us or us <= 0 then
    return 0
  end
  return math.floor(us * 1000 + 0.5)
end

-- A time for the reply, in nanoseconds: an integer reply is exact below 2^62; larger
-- values go as a float in a string.
function PL.nanos(us)
  local n = round_nanos(us)
  if n < 4611686018427387904 then
    return n
  end
  return string.format('%.17g', n)
end

-- Microseconds, rounded to the nearest nanosecond then up to the next whole microsecond,
-- as the memory store turns a `reset_after` into an expiry time.
function PL.expiry(now, reset_after)
  return now + math.ceil(round_nanos(reset_after) / 1000)
end

-- The time of a call: ARGV's time in µs when the client gives one (an injected clock), else
-- the server's `TIME`, which is returned too (its reply, two strings).
function PL.clock(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2]), t
  end
  return tonumber(arg), nil
end

-- A `pace`'s `max_wait`, sent as whole seconds and the nanoseconds beyond them ('' and ''
-- for none): in µs as Rust's `duration_to_micros` computes it, and in whole µs as
-- `Duration::as_micros` does (algorithms compare with one or the other).
function PL.max_wait(secs, nanos)
  local s = tonumber(secs)
  if not s then
    return nil, nil
  end
  local n = tonumber(nanos)
  return s * 1e6 + n / 1000, s * 1000000 + math.floor(n / 1000)
end

-- A key's record. `gcra` keeps a tag byte ('g') and its TAT as a little-endian double; it
-- is idle once the TAT has passed, so its expiry is ceil(TAT). `pacer` keeps a tag byte
-- ('p') and four little-endian doubles: expiry, watermark, last_drip, next_shot. The other
-- algorithms keep `cmsgpack.pack(algorithm, expiry, state)`, which starts with the name's
-- string header (0xa0 and up): the three forms never look alike. Doubles in binary are
-- exact, and cheaper for the server than text.
local GCRA_TAG, GCRA_LAYOUT = 103, '<Bd'
local PACER_TAG, PACER_LAYOUT = 112, '<Bdddd'

-- A `gcra` record.
function PL.pack_tat(tat)
  return struct.pack(GCRA_LAYOUT, GCRA_TAG, tat)
end

function PL.pack(alg, exp, state)
  if alg == 'gcra' then
    return PL.pack_tat(state[1])
  elseif alg == 'pacer' then
    return struct.pack(PACER_LAYOUT, PACER_TAG, exp, state[1], state[2], state[3])
  end
  return cmsgpack.pack(alg, exp, state)
end

-- The TAT of a `gcra` record, or nil for another algorithm's.
function PL.gcra_tat(raw)
  if string.byte(raw) == GCRA_TAG then
    local _, tat = struct.unpack(GCRA_LAYOUT, raw)
    return tat
  end
  return nil
end

-- The algorithm, expiry (µs) and state of a record `PL.pack` wrote.
function PL.unpack(raw)
  local tag = string.byte(raw)
  if tag == GCRA_TAG then
    local _, tat = struct.unpack(GCRA_LAYOUT, raw)
    return 'gcra', math.ceil(tat), { tat }
  elseif tag == PACER_TAG then
    local _, exp, watermark, last_drip, next_shot = struct.unpack(PACER_LAYOUT, raw)
    return 'pacer', exp, { watermark, last_drip, next_shot }
  end
  return cmsgpack.unpack(raw)
end

-- Stores a key's record after a decision, as the memory store keeps a key. `state` is the
-- key's own live state before the decision (nil if idle or another algorithm's), `old_exp`
-- its expiry, `new_state` what the algorithm returned (nil: unchanged). The key's own state
-- never expires earlier than before; a state replacing another algorithm's starts with an
-- expiry of its own. Returns the record written (or false when the key was deleted), or nil when nothing was written.
function PL.save(key, alg, state, old_exp, new_state, reset_after, idle_at, now, slack)
  if new_state == nil and state == nil then
    return nil
  end
  local exp = PL.expiry(now, reset_after)
  if state and old_exp > exp then
    exp = old_exp
  end
  if new_state == nil then
    new_state = state
  elseif idle_at then
    -- ceil(idle_at): for `gcra` the other terms never exceed it, so the record is idle
    -- exactly when its TAT has passed (`now` is a whole number of µs).
    exp = math.max(exp, math.ceil(idle_at))
  end
  -- An unchanged state is the key's own, so `old_exp` is set.
  if new_state == state and exp <= old_exp then
    return nil
  end
  if exp > now then
    local record = PL.pack(alg, exp, new_state)
    redis.call('SET', key, record, 'PX', math.ceil((exp - now) / 1000) + slack)
    return record
  end
  redis.call('DEL', key)
  return false
end
