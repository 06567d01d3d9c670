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
