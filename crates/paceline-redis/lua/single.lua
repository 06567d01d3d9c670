-- The single-decision entry points of `gcra` and `pacer`: one decision on one key, with
-- the least work for the server. They share the algorithms and the records of `decide`, so
-- single calls and batches may mix on a key.
--
-- KEYS[1]   the key.
-- ARGV[1]   now in µs since the Unix epoch, or '' to read the server's TIME.
-- ARGV[2]   milliseconds added to the key's time-to-live (0 when time is the server's).
-- ARGV[3]   op; ARGV[4] cost; ARGV[5], ARGV[6] max_wait as whole seconds and the
--           nanoseconds beyond them ('' and '' for none).
-- ARGV[7..] the policy's parameters, as `decide` takes them.
--
-- Returns one string: '1' if admitted, else '0'; then, when the time is the server's, its
-- TIME as "SECONDS MICROSECONDS "; then the key's record as it was before the call if it
-- held this algorithm's live state, else nothing. The client derives the decision's delay,
-- remaining and reset_after from that state with the Rust algorithm (the same code the
-- memory store runs), and checks that it admits exactly when the script did.
local function single_reply(allowed, t, record)
  local flag = allowed and '1' or '0'
  if t then
    return flag .. t[1] .. ' ' .. t[2] .. ' ' .. record
  end
  return flag .. record
end

local function single_gcra(KEYS, ARGV)
  local now, t = PL.clock(ARGV[1])
  local key = KEYS[1]
  local raw = redis.call('GET', key)
  -- Another algorithm's record leaves the key idle to `gcra`.
  local stored = raw and PL.gcra_tat(raw)
  local allowed, _, _, new_tat = PL.gcra_plan(tonumber(ARGV[7]), tonumber(ARGV[8]), stored, now,
    ARGV[3], tonumber(ARGV[4]), PL.max_wait(ARGV[5], ARGV[6]))
  if new_tat then
    -- The record is idle once its TAT has passed; it lives until then. A TAT at `now` (an
    -- interval below the resolution of `now` in a double) is idle at once: as `decide`
    -- does, delete the key, whichever algorithm's record it held.
    local idle_at = math.ceil(new_tat)
    if idle_at > now then
      local ttl = math.ceil((idle_at - now) / 1000) + tonumber(ARGV[2])
      redis.call('SET', key, PL.pack_tat(new_tat), 'PX', ttl)
    elseif raw then
      redis.call('DEL', key)
    end
  end
  return single_reply(allowed, t, stored and raw or '')
end

local function single_pacer(KEYS, ARGV)
  local now, t = PL.clock(ARGV[1])
  local key = KEYS[1]
  local raw = redis.call('GET', key)
  local state, old_exp
  if raw then
    local alg, exp, s = PL.unpack(raw)
    if alg == 'pacer' and exp > now then
      state, old_exp = s, exp
    end
  end
  local p = { tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]) }
  local allowed, _, _, reset_after, new_state =
    PL.alg.pacer(p, state, now, ARGV[3], tonumber(ARGV[4]), PL.max_wait(ARGV[5], ARGV[6]))
  PL.save(key, 'pacer', state, old_exp, new_state, reset_after, nil, now, tonumber(ARGV[2]))
  return single_reply(allowed, t, state and raw or '')
end
