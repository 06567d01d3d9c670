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
-- held this algorithm's state (for `gcra` any TAT, even a passed one, which the algorithm
-- treats as idle; for `pacer` only a live record), else nothing. The client derives the decision's delay,
-- remaining and reset_after from that state with the Rust algorithm (the same code the
-- memory store runs), and checks that it admits exactly when the script did.
--
-- Like `decide`, each entry point calls `PL.clock` first: it also sets the prelude's `math`
-- upvalues.
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
    -- The record lives until its TAT has passed (a TAT at `now`, from an interval below
    -- the resolution of `now` in a double, is idle at once: the key is deleted).
    PL.put(key, PL.pack_tat(new_tat), ceil(new_tat), now, tonumber(ARGV[2]))
  end
  return single_reply(allowed, t, stored and raw or '')
end

local function single_pacer(KEYS, ARGV)
  local now, t = PL.clock(ARGV[1])
  local key = KEYS[1]
  local raw = redis.call('GET', key)
  -- The key's own live state, if any.
  local w, l, n, old_exp
  if raw then
    local exp, watermark, last_drip, next_shot = PL.pacer_record(raw)
    if exp and exp > now then
      w, l, n, old_exp = watermark, last_drip, next_shot, exp
    end
  end
  local allowed, _, _, reset_after, new_w, new_l, new_n = PL.pacer_step(tonumber(ARGV[7]),
    tonumber(ARGV[8]), tonumber(ARGV[9]), w, l, n, now, ARGV[3], tonumber(ARGV[4]),
    PL.max_wait(ARGV[5], ARGV[6]))
  local exp = PL.next_expiry(now, reset_after, old_exp, nil, new_w ~= nil)
  if exp then
    if not new_w then
      new_w, new_l, new_n = w, l, n
    end
    PL.put(key, PL.pack_pacer(exp, new_w, new_l, new_n), exp, now, tonumber(ARGV[2]))
  end
  return single_reply(allowed, t, w and raw or '')
end
