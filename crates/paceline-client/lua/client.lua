-- paceline's API client limiter in Redis: the Lua twin of `Knowledge`
-- (`src/knowledge.rs`), rule for rule and in the same order, so that processes sharing a
-- token on one Redis decide as one process does in memory (a differential test runs both
-- on one virtual clock). It is loaded after paceline's algorithm twins (`PL`), which run
-- the global limit and the invalid-request budget.
--
-- Every call is one atomic step on one identity. KEYS[1] is the identity's base,
-- `PREFIX{c:IDENTITY}:` (never a key itself): every key is the base and a suffix, so all
-- of them share one hash tag and one cluster slot.
--
--   meta            MessagePack { seq, gs, gl, gp, gpause, is, warned, missing }: the
--                   admissions so far, the global limiter's state, the last admission it
--                   counted and its state before ({ s = state }), the global pause, the
--                   invalid-request budget's state, when its warning was last given, and
--                   the refusals without a retry-after in a row
--   routes          hash: route key -> the bucket id its responses named
--   b:MAJOR\nID     MessagePack of a bucket (see `new_bucket`)
--   m:MAJOR         MessagePack { p = { seq = at }, w = { route = until },
--                   x = { bucket id = until } }: pioneers in flight, routes of unknown
--                   bucket waiting to send theirs, known buckets with no call left
--   call:ID         MessagePack { e, r }: the reply `r` of the call of id ID, kept until
--                   `e` (the in-flight lease after it) for a repeat of the call
--
-- Records carry the time they say nothing more (`e`); one read after it is absent, and
-- Redis drops it a little later (its time to live is set from it).
--
-- ARGV[1] is the operation (`round`: events told, then asks), ARGV[2] the clock as
-- `PL.clock` reads it; then the configuration: the in-flight lease (µs), pioneers per
-- major, the headerless backoff, the missing retry-after, the longest backoff (µs), the
-- warning share, the invalid-request budget's limit, then the global policy and the
-- invalid-request budget, each as `PL.read_policy` reads it or '' for none. Then the call
-- id ('' for none), and the rest is the operation's (see `round`). Every reply starts with
-- the time of the call.
--
-- A call that counted something (admitted a request or told an event) under an id is
-- kept: a repeat of the id within the in-flight lease (its first reply was lost) is
-- answered with the first reply, the time in it included, and changes nothing. The
-- `Knowledge::round` of the twin.
--
-- Times are µs since the Unix epoch; every number is a whole number below 2^53.

local SAME_WINDOW_US = 50000
local KEEP_US = 10000000
local WANT_US = 2000000
local MAX_ROUTES = 65536
local DAY_MS = 86400000

local UNKNOWN, UNLIMITED, LIMITED = 0, 1, 2

local base, now, slack, cfg, meta

local function mx(a, b)
  if b > a then
    return b
  end
  return a
end

local function mn(a, b)
  if b < a then
    return b
  end
  return a
end

-- Rust's `micros(micros_to_duration(us))`: rounded to nanoseconds, then whole µs down.
local function trunc_micros(us)
  if us ~= us or us <= 0 then
    return 0
  end
  return math.floor(math.floor(us * 1000 + 0.5) / 1000)
end

-- Rust's `micros_to_duration(us)` in nanoseconds.
local function nanos(us)
  if us ~= us or us <= 0 then
    return 0
  end
  return math.floor(us * 1000 + 0.5)
end

local function int(x)
  return string.format('%.0f', x)
end

local function read_config(args)
  local c = {
    lease = mx(tonumber(args[3]), 1),
    allowed = mx(tonumber(args[4]), 1),
    headerless = tonumber(args[5]),
    missing = tonumber(args[6]),
    max_backoff = tonumber(args[7]),
    warn_at = tonumber(args[8]),
    invalid_limit = tonumber(args[9]),
  }
  local a = 10
  for _, name in ipairs({ 'global', 'invalid' }) do
    if args[a] == '' then
      a = a + 1
    else
      local policy, after = PL.read_policy(args, a)
      if not policy then
        -- `after` is the error message.
        return nil, after
      end
      c[name], a = policy, after
    end
  end
  return c, a
end

local function ttl_ms(exp)
  return PL.int(mx(math.ceil((exp - now) / 1000), 1) + slack)
end

local function load_meta()
  local raw = redis.call('GET', base .. 'meta')
  if raw then
    meta = cmsgpack.unpack(raw)
  else
    meta = { seq = 0, gpause = 0, warned = 0, missing = 0 }
  end
end

local function save_meta()
  redis.call('SET', base .. 'meta', cmsgpack.pack(meta), 'PX', DAY_MS + slack)
end

-- `policy.apply(&mut state, now, Op::Limit, 1)`: allowed, delay, remaining, reset_after,
-- and the state after.
local function apply(policy, state)
  -- A twin may change the table it is given: it gets a copy, so that what was read stays
  -- as it was (the state before an admission, a budget only looked at).
  if type(state) == 'table' then
    state = cmsgpack.unpack(cmsgpack.pack(state))
  end
  local allowed, delay, remaining, reset_after, new_state = policy.f(policy.p, state, now,
    'limit', 1, nil, nil)
  if new_state then
    state = new_state
  end
  return allowed, delay, remaining, reset_after, state
end

-- Buckets ----------------------------------------------------------------------------

local function new_bucket()
  -- k: what is known; l, r, ra, w, pn: limit, remaining, reset at, window, paced next
  -- (-1: none); f: requests in flight (admission -> when); pio: the pioneer's admission
  -- (-1: none); pu: paused until; t: when last asked about or admitted to.
  return { k = UNKNOWN, l = 0, r = 0, ra = 0, w = 0, pn = -1, f = {}, pio = -1, pu = 0, t = now }
end

local function bucket_name(key)
  return base .. 'b:' .. key.major .. '\n' .. key.id
end

-- `Bucket::expires`.
local function expires(b)
  local e = b.t + KEEP_US
  if b.k == LIMITED then
    e = mx(b.ra + b.w, e)
  end
  for _, at in pairs(b.f) do
    e = mx(e, at + cfg.lease)
  end
  return mx(e, b.pu)
end

-- `Bucket::settle`.
local function settle(b)
  for seq, at in pairs(b.f) do
    if at + cfg.lease <= now then
      b.f[seq] = nil
    end
  end
  if b.pio ~= -1 and b.f[b.pio] == nil then
    b.pio = -1
  end
end

local buckets

-- `Knowledge::load`: the bucket's record (its expired requests in flight forgotten),
-- created unknown when absent or expired; every load looks again, as the Rust one does.
local function load(key)
  local name = bucket_name(key)
  local b = buckets[name]
  if b == nil then
    local raw = redis.call('GET', name)
    if raw then
      b = cmsgpack.unpack(raw)
      b.f = b.f or {}
    end
  end
  if not b or expires(b) <= now then
    b = new_bucket()
  end
  settle(b)
  buckets[name] = b
  return b
end

local function save_buckets()
  for name, b in pairs(buckets) do
    if b == false then
      redis.call('DEL', name)
    else
      local e = expires(b)
      if e <= now then
        redis.call('DEL', name)
      else
        b.e = e
        redis.call('SET', name, cmsgpack.pack(b), 'PX', ttl_ms(e))
      end
    end
  end
end

local function count(t)
  local n = 0
  for _ in pairs(t) do
    n = n + 1
  end
  return n
end

-- `Bucket::exhausted`.
local function exhausted(b)
  if b.k == LIMITED and b.r == 0 and b.ra > now then
    return b.ra
  elseif b.k == UNKNOWN then
    return nil
  elseif b.pu > now then
    return b.pu
  end
  return nil
end

-- Majors -----------------------------------------------------------------------------

local majors

local function load_major(major)
  local m = majors[major]
  if m then
    return m
  end
  local raw = redis.call('GET', base .. 'm:' .. major)
  if raw then
    m = cmsgpack.unpack(raw)
  else
    m = {}
  end
  m.p = m.p or {}
  m.w = m.w or {}
  m.x = m.x or {}
  majors[major] = m
  return m
end

local function save_majors()
  for major, m in pairs(majors) do
    local e = 0
    for _, at in pairs(m.p) do
      e = mx(e, at + cfg.lease)
    end
    for _, t in pairs(m.w) do
      e = mx(e, t)
    end
    for _, t in pairs(m.x) do
      e = mx(e, t)
    end
    local name = base .. 'm:' .. major
    if e <= now then
      redis.call('DEL', name)
    else
      redis.call('SET', name, cmsgpack.pack(m), 'PX', ttl_ms(e))
    end
  end
end

-- `Knowledge::mark`.
local function mark(key)
  local till = exhausted(load(key))
  local m = load_major(key.major)
  if till then
    m.x[key.id] = till
  else
    m.x[key.id] = nil
  end
end

-- `Knowledge::pioneers`.
local function pioneers(major)
  local m = load_major(major)
  for seq, at in pairs(m.p) do
    if at + cfg.lease <= now then
      m.p[seq] = nil
    end
  end
  return count(m.p)
end

-- `Knowledge::discovery`: whether a route of unknown bucket waits, and the earliest time a
-- known bucket has a call again (nil: every one has).
local function discovery(major)
  local m = load_major(major)
  local wanted = false
  for route, t in pairs(m.w) do
    if t <= now then
      m.w[route] = nil
    else
      wanted = true
    end
  end
  local first
  for id, t in pairs(m.x) do
    if t <= now then
      m.x[id] = nil
    elseif not first or t < first then
      first = t
    end
  end
  return wanted, first
end

-- Routes -----------------------------------------------------------------------------

local routes

local function is_own(id)
  return string.byte(id, 1) == 0
end

-- `Knowledge::resolve`.
local function resolve(route, filed)
  local id = routes[route]
  if id == nil then
    id = redis.call('HGET', base .. 'routes', route)
    routes[route] = id
  end
  if id then
    return id
  end
  if not is_own(filed) then
    return filed
  end
  return '\0' .. route
end

-- The invalid-request budget ---------------------------------------------------------

-- `Knowledge::budget_spent`: the delay in ns, or nil.
local function budget_spent()
  if not cfg.invalid then
    return nil
  end
  local allowed, delay = apply(cfg.invalid, meta.is)
  if not allowed then
    return nanos(delay)
  end
  return nil
end

-- `Knowledge::count_invalid`: used and limit when a warning is due.
local function count_invalid()
  if not cfg.invalid then
    return nil
  end
  local _, _, remaining, reset_after, state = apply(cfg.invalid, meta.is)
  meta.is = state
  local used = mx(cfg.invalid_limit - remaining, 0)
  if used >= cfg.warn_at * cfg.invalid_limit and now >= meta.warned then
    meta.warned = now + trunc_micros(reset_after)
    return used, cfg.invalid_limit
  end
  return nil
end

-- Admission --------------------------------------------------------------------------

-- `Known::at`: a local reset of a limited bucket whose window has passed.
local function at_now(b)
  if b.k == LIMITED and now >= b.ra then
    b.r = b.l
    b.ra = now + b.w
    if b.pn == -1 then
      b.pn = now
    else
      b.pn = mx(b.pn, now)
    end
  end
end

-- `Knowledge::bucket_ready`: true and whether a pioneer, or false and the time to wait
-- until (nil: a response).
local function bucket_ready(b, pioneer_wait, pioneer_until, reserve)
  if b.pu > now then
    return false, b.pu
  end
  local overdue = b.k == LIMITED and now >= b.ra + b.w
  if next(b.f) == nil or overdue then
    at_now(b)
  end
  if b.k == UNKNOWN then
    if b.pio == -1 and not pioneer_wait then
      return true, true
    elseif b.pio ~= -1 then
      return false, nil
    end
    return false, pioneer_until
  elseif b.k == UNLIMITED then
    return true, false
  end
  if b.r <= reserve then
    if now < b.ra then
      return false, b.ra
    end
    return false, b.ra + b.w
  end
  if b.pn ~= -1 and b.pn > now then
    return false, b.pn
  end
  return true, false
end

-- `Knowledge::commit_bucket`.
local function commit_bucket(b, pioneer, seq)
  if b.k == LIMITED then
    b.r = b.r - 1
    if b.pn ~= -1 then
      local spacing = math.floor(b.w / mx(b.l, 1))
      local t = b.pn
      if now > t + spacing then
        t = now
      end
      b.pn = t + spacing
    end
  end
  b.f[seq] = now
  if pioneer then
    b.pio = seq
  end
  b.t = now
end

-- `Knowledge::admit_queue`: the reply's fields for one ask.
local function admit_queue(major, filed, list, out)
  local admitted = {}
  local moved, moved_route, moved_bucket = false, '', ''
  local wait_kind, wait_t = 0, 0
  for i = 1, #list, 2 do
    local route, exempt = list[i], list[i + 1] == '1'
    local id = resolve(route, filed)
    if id ~= filed then
      moved, moved_route, moved_bucket = true, route, id
      break
    end
    if not exempt and meta.gpause > now then
      wait_kind, wait_t = 1, meta.gpause
      break
    end
    local flying = pioneers(major)
    local wanted, ex = discovery(major)
    local pioneer_wait, pioneer_until = false, nil
    if flying >= cfg.allowed then
      pioneer_wait = true
    elseif ex then
      pioneer_wait, pioneer_until = true, ex
    end
    local reserve = 0
    if wanted or flying > 0 then
      reserve = cfg.allowed
    end
    local key = { major = major, id = id }
    local b = load(key)
    local ok, v = bucket_ready(b, pioneer_wait, pioneer_until, reserve)
    if not ok then
      if v then
        wait_kind, wait_t = 1, v
      else
        wait_kind, wait_t = 2, 0
      end
      mark(key)
      break
    end
    local pioneer = v
    local seq = meta.seq + 1
    local refused = false
    if not exempt and cfg.global then
      local before = meta.gs
      local allowed, delay, _, _, state = apply(cfg.global, meta.gs)
      if not allowed then
        wait_kind, wait_t = 1, now + mx(trunc_micros(delay), 1)
        mark(key)
        refused = true
      else
        meta.gs = state
        meta.gl = seq
        meta.gp = { s = before }
      end
    end
    if refused then
      break
    end
    meta.seq = seq
    commit_bucket(b, pioneer, seq)
    if pioneer then
      load_major(major).p[seq] = now
    end
    mark(key)
    admitted[#admitted + 1] = pioneer and 1 or 0
    admitted[#admitted + 1] = seq
  end
  out[#out + 1] = #admitted / 2
  for _, x in ipairs(admitted) do
    out[#out + 1] = x
  end
  out[#out + 1] = moved and 1 or 0
  out[#out + 1] = moved_route
  out[#out + 1] = moved_bucket
  out[#out + 1] = wait_kind
  out[#out + 1] = wait_t
  return #admitted > 0
end

-- admit: the number of asks, then per ask its major, its bucket, the number of its
-- requests n, then n times a route key and '1' when the global limit spares it. Appends
-- to `out` the invalid-request budget's delay in ns when it is spent (-1: it is not),
-- then per ask: the number admitted k, k times whether a pioneer (1/0) and the admission,
-- whether the next request moved (1/0), the route and the bucket it moved to, the wait
-- (0: none, 1: until, 2: a response) and its time. Answers whether it admitted any.
local function admit(args, a, out)
  local spent = budget_spent()
  if spent then
    out[#out + 1] = spent
    return false
  end
  local asks = {}
  local n = tonumber(args[a])
  a = a + 1
  for i = 1, n do
    local major, filed, k = args[a], args[a + 1], tonumber(args[a + 2])
    local list = {}
    for j = 1, 2 * k do
      list[j] = args[a + 2 + j]
    end
    asks[i] = { major = major, filed = filed, list = list }
    a = a + 3 + 2 * k
  end
  for _, ask in ipairs(asks) do
    if ask.list[1] then
      local id = resolve(ask.list[1], ask.filed)
      local b = load({ major = ask.major, id = id })
      b.t = now
      if b.k == UNKNOWN and b.pu <= now then
        load_major(ask.major).w[ask.list[1]] = now + WANT_US
      end
    end
  end
  out[#out + 1] = -1
  local any = false
  for _, ask in ipairs(asks) do
    if admit_queue(ask.major, ask.filed, ask.list, out) then
      any = true
    end
  end
  return any
end

-- Ends -------------------------------------------------------------------------------

-- `Knowledge::end`.
local function end_request(key, pioneer, seq)
  local b = load(key)
  b.f[seq] = nil
  if b.pio == seq then
    b.pio = -1
  end
  if pioneer then
    load_major(key.major).p[seq] = nil
  end
end

-- release: route, major, bucket, pioneer (1/0), admission, sent (1/0), failed (1/0).
local function release(args, a)
  local route, major, id = args[a], args[a + 1], args[a + 2]
  local pioneer, seq = args[a + 3] == '1', tonumber(args[a + 4])
  local sent, failed = args[a + 5] == '1', args[a + 6] == '1'
  local key = { major = major, id = id }
  end_request(key, pioneer, seq)
  if pioneer then
    -- A pioneer given back no longer waits to go: its route's next ask says if another
    -- does.
    load_major(major).w[route] = nil
  end
  if failed and pioneer then
    local b = load(key)
    if b.k == UNKNOWN then
      b.pu = mx(b.pu, now + cfg.headerless)
    end
  end
  if not sent then
    local b = load(key)
    if b.k == LIMITED then
      b.r = mn(b.r + 1, b.l)
    end
    if meta.gl == seq then
      meta.gs = meta.gp and meta.gp.s
      meta.gl = nil
      meta.gp = nil
    end
  end
  mark(key)
end

-- `Knowledge::learn`.
local function learn(b, limit, left, reset_after, pioneer, seq, age)
  local reset_at = now + mx(reset_after - age, 0)
  local in_flight, later = 0, 0
  for s in pairs(b.f) do
    in_flight = in_flight + 1
    if s > seq then
      later = later + 1
    end
  end
  if b.k == LIMITED then
    local l = mx(limit or b.l, 1)
    local window = mx(b.w, reset_after)
    if reset_at > b.ra + SAME_WINDOW_US then
      b.l, b.r, b.ra, b.w, b.pn = l, mn(mx(left - in_flight, 0), l), reset_at, window, -1
    elseif reset_at + SAME_WINDOW_US < b.ra then
      return
    else
      local ours = b.r
      if pioneer then
        ours = mx(ours - 1, 0)
        left = mx(left - later, 0)
      end
      b.l, b.r, b.ra, b.w, b.pn = l, mn(ours, left), reset_at, window, -1
    end
  else
    local l = mx(limit or (left + 1), 1)
    b.k = LIMITED
    b.l, b.r, b.ra, b.w, b.pn = l, mn(mx(left - in_flight, 0), l), reset_at, mx(reset_after, 1), -1
  end
end

-- `Knowledge::refused`: when the pause ends.
local function refused(key, scope, retry_after, age)
  local wait = retry_after
  if not wait then
    local doubled = cfg.missing * 2 ^ mn(meta.missing, 20)
    meta.missing = meta.missing + 1
    wait = mn(doubled, cfg.max_backoff)
  end
  wait = mx(wait - age, 0)
  local till = now + mx(wait, 1)
  if scope == 'g' then
    meta.gpause = mx(meta.gpause, till)
  else
    local b = load(key)
    b.pu = mx(b.pu, till)
    if b.k == LIMITED then
      b.r = 0
    end
  end
  return till
end

local function opt(text)
  if text == '' then
    return nil
  end
  return tonumber(text)
end

-- answer: route, major, bucket, pioneer (1/0), admission, status, the bucket the response
-- named ('' after '0': none), as '1' or '0' then the id; its limit, remaining and
-- reset-after in µs ('' for none); the refusal's scope ('' none, 'b', 's', 'g') and
-- retry-after in µs (''); how long ago the response came in µs (the durations count from
-- then). Answers when the refusal's pause ends (-1: none), and the
-- budget's use and limit when a warning is due (-1 -1).
local function answer(args, a)
  local route, major, id = args[a], args[a + 1], args[a + 2]
  local pioneer, seq, status = args[a + 3] == '1', tonumber(args[a + 4]), tonumber(args[a + 5])
  local has_bucket, named = args[a + 6] == '1', args[a + 7]
  local limit, left, reset_after = opt(args[a + 8]), opt(args[a + 9]), opt(args[a + 10])
  local scope, retry_after = args[a + 11], opt(args[a + 12])
  local age = tonumber(args[a + 13])
  local key = { major = major, id = id }
  end_request(key, pioneer, seq)
  if has_bucket then
    routes[route] = named
    redis.call('HSET', base .. 'routes', route, named)
    if redis.call('HLEN', base .. 'routes') > MAX_ROUTES then
      redis.call('DEL', base .. 'routes')
      routes = {}
    end
    if named ~= id then
      if is_own(id) and next(load(key).f) == nil then
        buckets[bucket_name(key)] = false
        load_major(major).x[id] = nil
      end
      key = { major = major, id = named }
    end
  end
  local b = load(key)
  if left and reset_after then
    learn(b, limit, left, reset_after, pioneer, seq, age)
  elseif status >= 200 and status < 400 and scope == '' then
    if b.k == UNKNOWN then
      b.k = UNLIMITED
    end
  elseif pioneer and b.k == UNKNOWN and scope == '' then
    b.pu = mx(b.pu, now + cfg.headerless)
  end
  if b.k ~= UNKNOWN or b.pu > now then
    load_major(major).w[route] = nil
  end
  local used, of = -1, -1
  if status == 401 or (status == 403 and scope == '') or (scope ~= '' and scope ~= 's') then
    local u, l = count_invalid()
    if u then
      used, of = u, l
    end
  end
  if status >= 200 and status < 300 then
    meta.missing = 0
  end
  local till = -1
  if scope ~= '' then
    till = refused(key, scope, retry_after, age)
  end
  mark(key)
  return till, used, of
end

-- round: what happened, then what may go. The number of events, then each: 'a' and an
-- answer's 14 fields (see `answer`), or 'r' and a release's 7 (see `release`); then the
-- asks (see `admit`; a count of 0 for none). Replies the time, per event when its pause
-- ends and the budget's use and limit when a warning is due (-1 each for none, and for a
-- release), then the admission (see `admit`: -1 alone when nothing was asked). Answers the
-- reply, and whether the call counted something (told an event or admitted a request).
local function round(args, a)
  local out = { now }
  local events = tonumber(args[a])
  a = a + 1
  for _ = 1, events do
    local kind = args[a]
    a = a + 1
    if kind == 'a' then
      local till, used, of = answer(args, a)
      a = a + 14
      out[#out + 1] = till
      out[#out + 1] = used
      out[#out + 1] = of
    else
      release(args, a)
      a = a + 7
      out[#out + 1] = -1
      out[#out + 1] = -1
      out[#out + 1] = -1
    end
  end
  local counted = events > 0
  if tonumber(args[a]) > 0 then
    if admit(args, a, out) then
      counted = true
    end
  else
    out[#out + 1] = -1
  end
  return out, counted
end

local OPS = { round = round }

local function client_call(KEYS, ARGV)
  base = KEYS[1]
  local op = OPS[ARGV[1]]
  if not op then
    return redis.error_reply('paceline: unknown client operation ' .. tostring(ARGV[1]))
  end
  local config, a = read_config(ARGV)
  if not config then
    return redis.error_reply(a)
  end
  cfg = config
  local server_time
  now, server_time, slack = PL.clock(ARGV[2])
  -- A repeat of a call that counted something answers its first reply.
  local call_key
  if ARGV[a] ~= '' then
    call_key = base .. 'call:' .. ARGV[a]
    local raw = redis.call('GET', call_key)
    if raw then
      local kept = cmsgpack.unpack(raw)
      if kept.e > now then
        return kept.r
      end
    end
  end
  buckets, majors, routes = {}, {}, {}
  load_meta()
  local reply, counted = op(ARGV, a + 1)
  -- `load` of a bucket that was read for its buckets' sake only writes what it was.
  save_buckets()
  save_majors()
  save_meta()
  -- The `routes` hash lives as long as the identity is in use.
  redis.call('PEXPIRE', base .. 'routes', DAY_MS + slack)
  for i, x in ipairs(reply) do
    if type(x) == 'number' then
      reply[i] = int(x)
    end
  end
  if call_key and counted then
    local e = now + cfg.lease
    redis.call('SET', call_key, cmsgpack.pack({ e = e, r = reply }), 'PX', ttl_ms(e))
  end
  return reply
end
