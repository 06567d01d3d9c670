-- paceline's Lua library: the helpers every algorithm twin shares.
--
-- Each algorithm file adds one function to `PL.alg` (`gcra` and `pacer` also export their
-- arithmetic over bare numbers, `PL.gcra_plan` and `PL.pacer_step`, for the lean entry
-- points in `lean.lua`):
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
-- `new_state` is the state to store, or nil when the request changes nothing: a table of its
-- own, shared with nothing (not `p`, not a table kept between calls), which the caller may
-- keep and change (the queue keeps groups' states between calls). `idle_at`,
-- given with a new state by an algorithm whose state has no expiry of its own (`gcra`), is
-- the time in µs from which that state is idle: its record lives at least until then.
-- Every twin repeats the float operations of its Rust original in the same order, so both
-- give bit-identical results: Redis's Lua numbers are IEEE doubles like Rust's f64.
local PL = { alg = {} }

-- `paceline_core::policy::MAX_CHARGED` (2^50): the most cost one count holds, so that
-- charges past the limit keep counts exact.
PL.MAX_CHARGED = 1125899906842624

-- The longest time to live a record is written with, in ms: 2^53 µs (285 years).
PL.MAX_TTL_MS = 9007199254740

-- `math`'s functions, and the `struct` and `string` functions the records use, as upvalues,
-- which every function here reads faster than a global. A function library's load cannot
-- see the globals, so `PL.clock`, which every entry point calls first, sets them at the
-- first call. The hottest paths (`gcra` and `pacer`) compare inline instead:
-- `b > a and b or a` is exactly `max(a, b)` (which keeps `a` unless `b` is greater),
-- `b < a and b or a` exactly `min(a, b)`, and saves a C call.
local max, min, floor, ceil
local pack_struct, unpack_struct, byte
-- How whole numbers below 2^53 are printed (`PL.int`), chosen by the first call too. '%d'
-- prints one exactly as a C long, at a fraction of the cost of '%.0f' (or of Lua's own
-- printing of a number), which go through the C library's floating-point printing; where
-- a long is narrower than 64 bits (a 32-bit build of Redis), '%.0f' it is.
local INT, PADDED

-- A whole number below 2^53 as text: for a `redis.call` argument, which Lua would
-- otherwise print with its floating-point printing.
function PL.int(x)
  return string.format(INT, x)
end

-- `PL.int(n)` padded with zeros to 20 digits, so that text order is number order.
function PL.padded(n)
  return string.format(PADDED, n)
end

-- Rust's `util::floor_count`: a non-negative count, truncated.
function PL.floor_count(x)
  if x ~= x or x <= 0 then
    return 0
  end
  return floor(x)
end

-- Rust's `util::retry_after_max_wait`.
function PL.retry_after_max_wait(delay, max_wait)
  return max(delay - max_wait, 0)
end

-- Rust's `micros_to_duration`, in nanoseconds: negative and NaN are 0, the rest rounds
-- half up.
local function round_nanos(us)
  if us ~= us or us <= 0 then
    return 0
  end
  return floor(us * 1000 + 0.5)
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

-- Appends one decision to a reply, as the store reads it back: allowed (1 or 0), delay and
-- reset_after in nanoseconds, remaining, and the lease (-1: none).
function PL.reply(out, allowed, delay, remaining, reset_after, lease)
  out[#out + 1] = allowed and 1 or 0
  out[#out + 1] = PL.nanos(delay)
  out[#out + 1] = remaining
  out[#out + 1] = PL.nanos(reset_after)
  out[#out + 1] = lease or -1
end

-- Microseconds, rounded to the nearest nanosecond then up to the next whole microsecond,
-- as the memory store turns a `reset_after` into an expiry time.
function PL.expiry(now, reset_after)
  return now + ceil(round_nanos(reset_after) / 1000)
end

-- Two whole numbers sent as one argument, "A B" (nil and nil if malformed).
local function pair(text)
  local a, b = string.match(text, '^(%d+) (%d+)$')
  return tonumber(a), tonumber(b)
end

-- The time of a call and the milliseconds to add to every time-to-live it writes, from
-- its first argument: '' for the server's `TIME` (whose reply, two strings, is returned
-- too) and no slack, else an injected time in µs and the slack, as "NOW SLACK".
function PL.clock(arg)
  if not ceil then
    max, min, floor, ceil = math.max, math.min, math.floor, math.ceil
    pack_struct, unpack_struct, byte = struct.pack, struct.unpack, string.byte
    if string.format('%d', 2 ^ 53) == '9007199254740992' then
      INT, PADDED = '%d', '%020d'
    else
      INT, PADDED = '%.0f', '%020.0f'
    end
  end
  if arg == '' then
    local t = redis.call('TIME')
    -- Arithmetic reads each string as `tonumber` does, once (`tonumber` reads it twice).
    return t[1] * 1000000 + t[2], t, 0
  end
  local now, slack = pair(arg)
  return now, nil, slack
end

-- `compute`, remembered for the values of `key` seen in earlier calls, at most `limit` of
-- them (all forgotten when full): for what the client sends call after call and a call
-- would otherwise work out again. `compute(key)` gives a value or nil; a nil `key` gives
-- nil. What it gives back is shared: never to be changed in place.
function PL.memo(limit, compute)
  local cache, kept = {}, 0
  return function(key)
    if key == nil then
      return nil
    end
    local value = cache[key]
    if value == nil then
      value = compute(key) or false
      if kept == limit then
        cache, kept = {}, 0
      end
      cache[key] = value
      kept = kept + 1
    end
    return value or nil
  end
end

-- `tonumber(text)`, remembered (nil for text that is not a number): numbers the client
-- repeats call after call (parameters, costs, counts), where `tonumber` parses a string
-- twice and a lookup costs less.
PL.num = PL.memo(1024, function(text)
  return tonumber(text)
end)

-- A `pace`'s `max_wait`, sent as "SECONDS NANOSECONDS" (the nanoseconds beyond the whole
-- seconds; '' for none): in µs as Rust's `duration_to_micros` computes it, and in whole µs
-- as `Duration::as_micros` does (algorithms compare with one or the other).
function PL.max_wait(arg)
  if arg == '' then
    return nil, nil
  end
  local s, n = pair(arg)
  if not s then
    -- Malformed: the batch reader refuses it.
    return nil, nil
  end
  return s * 1e6 + n / 1000, s * 1000000 + floor(n / 1000)
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
  return pack_struct(GCRA_LAYOUT, GCRA_TAG, tat)
end

-- A `pacer` record.
function PL.pack_pacer(exp, watermark, last_drip, next_shot)
  return pack_struct(PACER_LAYOUT, PACER_TAG, exp, watermark, last_drip, next_shot)
end

function PL.pack(alg, exp, state)
  if alg == 'gcra' then
    return PL.pack_tat(state[1])
  elseif alg == 'pacer' then
    return PL.pack_pacer(exp, state[1], state[2], state[3])
  end
  return cmsgpack.pack(alg, exp, state)
end

-- The TAT of a `gcra` record, or nil for another algorithm's.
function PL.gcra_tat(raw)
  if byte(raw) == GCRA_TAG and #raw == 9 then
    local _, tat = unpack_struct(GCRA_LAYOUT, raw)
    return tat
  end
  return nil
end

-- The expiry, watermark, last_drip and next_shot of a `pacer` record, or nothing for
-- another algorithm's.
function PL.pacer_record(raw)
  if byte(raw) == PACER_TAG and #raw == 33 then
    local _, exp, watermark, last_drip, next_shot = unpack_struct(PACER_LAYOUT, raw)
    return exp, watermark, last_drip, next_shot
  end
  return nil
end

-- The algorithm, expiry (µs) and state of a record `PL.pack` wrote.
function PL.unpack(raw)
  local tat = PL.gcra_tat(raw)
  if tat then
    return 'gcra', ceil(tat), { tat }
  end
  local exp, watermark, last_drip, next_shot = PL.pacer_record(raw)
  if exp then
    return 'pacer', exp, { watermark, last_drip, next_shot }
  end
  return cmsgpack.unpack(raw)
end

-- When a key's record must expire after a decision, as the memory store keeps a key, or
-- nil when the record is not to be written. `changed`: the decision wrote a new state, which
-- expires at the decision's `reset_after`, never earlier than the key's own live record did
-- (`old_exp`, nil for none: a state replacing another algorithm's starts with an expiry of
-- its own), and for an algorithm whose state has no expiry of its own (`gcra`), not before
-- its `idle_at` (ceil(idle_at): for `gcra` the other terms never exceed it, so the record is
-- idle exactly when its TAT has passed; `now` is a whole number of µs). Unchanged, the key's
-- own live record is rewritten only to live longer.
function PL.next_expiry(now, reset_after, old_exp, idle_at, changed)
  if not old_exp then
    -- A new state on an idle key (the common case first), or nothing to write.
    if not changed then
      return nil
    end
    local exp = PL.expiry(now, reset_after)
    if idle_at then
      exp = max(exp, ceil(idle_at))
    end
    return exp
  end
  local exp = PL.expiry(now, reset_after)
  if old_exp and old_exp > exp then
    exp = old_exp
  end
  if not changed then
    if exp <= old_exp then
      return nil
    end
    return exp
  end
  if idle_at then
    exp = max(exp, ceil(idle_at))
  end
  return exp
end

-- Time-to-live arguments below 1024 ms as text, made once: a number given to `redis.call`
-- is printed anew at every call, by the C library's floating-point printing, and most
-- records live a few ms.
local px_text = {}

-- Writes `record` to live until `exp`, or deletes the key if `exp` has come. Returns what
-- the key now holds (false: nothing).
function PL.put(key, record, exp, now, slack)
  if exp > now then
    local ms = ceil((exp - now) / 1000) + slack
    if ms > PL.MAX_TTL_MS then
      -- A schedule booked centuries ahead (a `pace` or `charge` of a huge cost): Redis
      -- refuses a time to live past 2^63 ms, so the record lives 285 years at most.
      ms = PL.MAX_TTL_MS
    end
    if ms < 1024 then
      local text = px_text[ms]
      if not text then
        text = tostring(ms)
        px_text[ms] = text
      end
      ms = text
    else
      ms = PL.int(ms)
    end
    redis.call('SET', key, record, 'PX', ms)
    return record
  end
  redis.call('DEL', key)
  return false
end

-- Stores a key's record after a decision. `state` is the key's own live state before the
-- decision (nil if idle or another algorithm's) and `old_exp` its expiry, `new_state` what
-- the algorithm returned (nil: unchanged). Returns what the key now holds (a record, or
-- false), or nil when nothing was written.
function PL.save(key, alg, state, old_exp, new_state, reset_after, idle_at, now, slack)
  local exp = PL.next_expiry(now, reset_after, old_exp, idle_at, new_state ~= nil)
  if not exp then
    return nil
  end
  return PL.put(key, PL.pack(alg, exp, new_state or state), exp, now, slack)
end

-- A policy from `args` at index `a`: its algorithm, the number of parameters n, then the n
-- parameters, as the Rust store sends them. Returns { alg, f, p } (`f`: the algorithm's
-- function, `p`: the parameters as numbers) and the index after the policy; or nil and an
-- error message.
function PL.read_policy(args, a)
  local alg = args[a]
  local f = PL.alg[alg]
  if not f then
    return nil, 'paceline: unknown algorithm ' .. tostring(alg)
  end
  local n = PL.num(args[a + 1])
  if not n then
    return nil, 'paceline: ' .. alg .. ' with ' .. tostring(args[a + 1]) .. ' parameters'
  end
  local p = {}
  for j = 1, n do
    local text = args[a + 1 + j]
    p[j] = PL.num(text)
    -- '' leaves an optional parameter unset.
    if not p[j] and text ~= '' then
      return nil, 'paceline: ' .. alg .. ' parameter ' .. j .. ' is ' .. tostring(text)
    end
  end
  return { alg = alg, f = f, p = p }, a + 2 + n
end

-- The requests of a batch call (`decide` and the lean batch take the same arguments):
--
-- KEYS[i]   the i-th decision's Redis key; or only the first decision's key, when the
--           keys are listed in ARGV (a cluster batch over several slots of one node).
-- ARGV[1]   the clock, as `PL.clock` reads it.
-- ARGV[2]   k: 0 when the keys are KEYS; otherwise k keys follow, the i-th decision's
--           first. Then the number of distinct policies m, and m times: algorithm, the
--           number of parameters n, and the n parameters.
-- Then the number of runs r, and r times: how many consecutive decisions the run holds,
-- their policy's number (1 to m), op, cost, and max_wait (as `PL.max_wait` reads it). A
-- batch of one limiter's requests with one op and cost is one run.
--
-- Returns the keys, whether they were listed in ARGV, and the runs, each a table { count,
-- policy, op, cost, max_wait, max_wait_us } (`policy`: { alg, f, p }); or nil and an error
-- message for a malformed call, which must then change nothing.
function PL.read_batch(KEYS, ARGV)
  local keys, a = KEYS, 3
  local listed = PL.num(ARGV[2])
  if listed > 0 then
    keys = {}
    for i = 1, listed do
      keys[i] = ARGV[2 + i]
    end
    a = 3 + listed
  end
  local policies = {}
  local m = PL.num(ARGV[a])
  a = a + 1
  for i = 1, m do
    local policy, after = PL.read_policy(ARGV, a)
    if not policy then
      return nil, after
    end
    policies[i] = policy
    a = after
  end
  local runs, total = {}, 0
  for r = 1, PL.num(ARGV[a]) do
    local b = a + 1 + (r - 1) * 5
    local count, policy, op = PL.num(ARGV[b]), policies[PL.num(ARGV[b + 1])], ARGV[b + 2]
    if not count or count < 1 or count % 1 ~= 0 then
      return nil, 'paceline: a run of ' .. tostring(ARGV[b]) .. ' decisions'
    end
    if not policy then
      return nil, 'paceline: no policy ' .. tostring(ARGV[b + 1])
    end
    if op ~= 'pace' and op ~= 'limit' and op ~= 'peek' and op ~= 'charge' then
      return nil, 'paceline: unknown op ' .. tostring(op)
    end
    local cost = PL.num(ARGV[b + 3])
    if not cost or cost < 1 or cost % 1 ~= 0 then
      return nil, 'paceline: a cost of ' .. tostring(ARGV[b + 3])
    end
    local max_wait, max_wait_us = PL.max_wait(ARGV[b + 4])
    if ARGV[b + 4] ~= '' and not max_wait then
      return nil, 'paceline: a max_wait of ' .. tostring(ARGV[b + 4])
    end
    runs[r] = { count = count, policy = policy, op = op, cost = cost, max_wait = max_wait,
      max_wait_us = max_wait_us }
    total = total + count
  end
  if total ~= #keys then
    return nil, 'paceline: ' .. total .. ' decisions for ' .. #keys .. ' keys'
  end
  return keys, listed > 0, runs
end

-- The start of the batch entry points (`decide.lua`, `decide_all.lua`): the call's time
-- and time-to-live slack (`PL.clock`, called first), the batch read and checked whole
-- (`PL.read_batch`) and every key's record (`PL.read_records`), before any key is touched,
-- so that a malformed call changes nothing. Returns nil, now, slack, keys, runs, records;
-- or the error reply to return.
function PL.open_batch(KEYS, ARGV)
  local now, _, slack = PL.clock(ARGV[1])
  local keys, listed, runs = PL.read_batch(KEYS, ARGV)
  if not keys then
    return redis.error_reply(listed)
  end
  local records, refused = PL.read_records(keys, listed)
  if not records then
    return refused
  end
  return nil, now, slack, keys, runs, records
end

-- Every key's record (false: none), read before anything is written: a key this node does
-- not serve fails the call here, with nothing changed. One MGET when the keys were declared
-- (they share a slot, or the server is not a cluster); one GET each when listed, since they
-- may span slots, which one command may not. A listed key the node refuses (its slot moved)
-- returns nil and an error reply of code PLREROUTE, which tells the client to send the
-- batch again per slot.
function PL.read_records(keys, listed)
  local records = {}
  if #keys == 0 then
    return records
  end
  if listed then
    for i = 1, #keys do
      local key = keys[i]
      if records[key] == nil then
        local raw = redis.pcall('GET', key)
        if type(raw) == 'table' and raw.err then
          return nil, redis.error_reply('PLREROUTE a key of this batch is not served here: ' .. raw.err)
        end
        records[key] = raw
      end
    end
    return records
  end
  local raws = redis.call('MGET', unpack(keys))
  for i = 1, #keys do
    local key = keys[i]
    if records[key] == nil then
      records[key] = raws[i]
    end
  end
  return records
end
