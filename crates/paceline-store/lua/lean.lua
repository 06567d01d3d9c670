-- The lean entry points of `gcra` and `pacer`: decisions that cost the server the least
-- work. The server applies each decision and answers only whether it admitted and the
-- key's state before it; the client derives the decision's delay, remaining and
-- reset_after from that state with the Rust algorithm (the same code the memory store
-- runs), and checks that it admits exactly when the script did. They share the algorithms
-- and the records of `decide`, so lean calls and `decide` may mix on a key.
--
-- Each decision's answer is '1' if admitted, else '0', then the key's record as it was
-- before the decision if it held this algorithm's state (for `gcra` any TAT, even a passed
-- one, which the algorithm treats as idle; for `pacer` only a live record), else nothing.
-- A record's tag byte tells its length: 'g' 9 bytes, 'p' 33.
--
-- Like `decide`, each entry point calls `PL.clock` first: it also sets the prelude's
-- upvalues.

-- One `gcra` decision with parameters `p1`, `p2` on a key holding `raw` (false: nothing).
-- Returns whether it admits, its answer's record ('' for none), and the key's new record and
-- its expiry (nil: unchanged).
local function gcra_decision(p1, p2, _, raw, now, op, cost, max_wait)
  -- Another algorithm's record leaves the key idle to `gcra`.
  local stored = raw and PL.gcra_tat(raw)
  local allowed, _, _, new_tat = PL.gcra_plan(p1, p2, stored, now, op, cost, max_wait)
  local seen = stored and raw or ''
  if new_tat then
    -- The record lives until its TAT has passed (a TAT at `now`, from an interval below
    -- the resolution of `now` in a double, is idle at once: the key is deleted).
    return allowed, seen, PL.pack_tat(new_tat), ceil(new_tat)
  end
  return allowed, seen
end

-- One `pacer` decision, as `gcra_decision`.
local function pacer_decision(p1, p2, p3, raw, now, op, cost, max_wait)
  -- The key's own live state, if any.
  local w, l, n, old_exp
  if raw then
    local exp, watermark, last_drip, next_shot = PL.pacer_record(raw)
    if exp and exp > now then
      w, l, n, old_exp = watermark, last_drip, next_shot, exp
    end
  end
  local allowed, _, reset_after, new_w, new_l, new_n =
    PL.pacer_step(p1, p2, p3, w, l, n, now, op, cost, max_wait)
  local seen = w and raw or ''
  local exp = PL.next_expiry(now, reset_after, old_exp, nil, new_w ~= nil)
  if exp then
    if not new_w then
      new_w, new_l, new_n = w, l, n
    end
    return allowed, seen, PL.pack_pacer(exp, new_w, new_l, new_n), exp
  end
  return allowed, seen
end

local lean_decision = { gcra = gcra_decision, pacer = pacer_decision }

-- The server's time for a reply, "SECONDS MICROSECONDS ", or '' for an injected time.
local function time_text(t)
  if t then
    return t[1] .. ' ' .. t[2] .. ' '
  end
  return ''
end

-- One decision on KEYS[1].
--
-- ARGV[1]   the clock, as `PL.clock` reads it.
-- ARGV[2]   op; ARGV[3] cost; ARGV[4] max_wait, as `PL.max_wait` reads it.
-- ARGV[5..] the policy's parameters, as `decide` takes them.
--
-- Returns one string, as the lean batch's for one decision.
local function single(decision, KEYS, ARGV)
  local now, t, slack = PL.clock(ARGV[1])
  local key = KEYS[1]
  local allowed, seen, record, exp = decision(PL.num(ARGV[5]), PL.num(ARGV[6]),
    PL.num(ARGV[7]), redis.call('GET', key), now, ARGV[2], PL.num(ARGV[3]),
    PL.max_wait(ARGV[4]))
  if exp then
    PL.put(key, record, exp, now, slack)
  end
  return time_text(t) .. (allowed and '1' or '0') .. seen
end

local function single_gcra(KEYS, ARGV)
  return single(gcra_decision, KEYS, ARGV)
end

local function single_pacer(KEYS, ARGV)
  return single(pacer_decision, KEYS, ARGV)
end

-- Decisions of `gcra` and `pacer` policies, in order, each on its own key (a key may
-- repeat), with the arguments of `decide` (see `PL.read_batch`).
--
-- Returns one string: the server's time ("SECONDS MICROSECONDS ", or nothing for an
-- injected time), then each decision's answer in order. A decision sees the earlier ones'
-- effects; each key is written once, after the last decision on it.
local function lean_batch(KEYS, ARGV)
  local now, t, slack = PL.clock(ARGV[1])
  local keys, listed, runs = PL.read_batch(KEYS, ARGV)
  if not keys then
    return redis.error_reply(listed)
  end
  for r = 1, #runs do
    if not lean_decision[runs[r].policy.alg] then
      return redis.error_reply('paceline: no lean entry point for ' .. runs[r].policy.alg)
    end
  end
  local records, refused = PL.read_records(keys, listed)
  if not records then
    return refused
  end
  local out = { time_text(t) }
  -- The keys written, in order, and each one's expiry.
  local written, exps = {}, {}
  local i = 0
  for r = 1, #runs do
    local run = runs[r]
    local decision, p = lean_decision[run.policy.alg], run.policy.p
    local p1, p2, p3 = p[1], p[2], p[3]
    local op, cost, max_wait = run.op, run.cost, run.max_wait
    for _ = 1, run.count do
      i = i + 1
      local key = keys[i]
      local allowed, seen, record, exp = decision(p1, p2, p3, records[key], now, op, cost,
        max_wait)
      if exp then
        if not exps[key] then
          written[#written + 1] = key
        end
        exps[key] = exp
        -- A record whose expiry has come is deleted: the next decision sees none.
        records[key] = exp > now and record
      end
      out[i + 1] = (allowed and '1' or '0') .. seen
    end
  end
  for j = 1, #written do
    local key = written[j]
    PL.put(key, records[key] or '', exps[key], now, slack)
  end
  return table.concat(out)
end
