-- paceline's job queue in Redis: the Lua twin of `QueueCore` (`src/core/`), rule for rule
-- and in the same order, so that a queue answers alike in memory and in Redis (a
-- differential test runs both on one virtual clock). It is loaded after paceline's
-- algorithm twins (`PL`), which decide the groups' starts.
--
-- Every call is one atomic step on one queue. KEYS[1] is the queue's base, `PREFIX{q:NAME}:`
-- (never a key itself): every key of the queue is the base and a suffix, so all of them
-- share one hash tag and one cluster slot.
--
--   meta         { seq, last_id, now, jobs, due, rdue, totals = { ... } } in binary (see
--                `read_meta`): `due` no later than the first score in `leases`,
--                `scheduled` and `dedupx`, `rdue` than the first in `retiring` (nil:
--                unknown), so that a call before them skips their maintenance
--   config       MessagePack { fp, default, spec, gc, ma, lease, bo, bo_max, max_jobs, mp,
--                qc, qp, qspec, parts, sfx }
--   policies     hash: group -> MessagePack of its own policy's arguments
--   specs        hash: group -> its own policy's spec (for `read_config`)
--   rpolicies    hash: group -> MessagePack of the arguments of the policy set for it at
--                run time (`set_policy`), which wins over `policies`; kept when the
--                configuration changes
--   rspecs       hash: group -> that policy's spec
--   groups       set of the groups held
--   g:GROUP      the group (see `group_entry`): flat and binary when its policy states are
--                `gcra`'s or none (see `pack_group`), else MessagePack
--   l:GROUP      the front of the group's line: the jobs that went back to it (a lease
--                ran out, a retry came due, a release, a pause) and every job of a
--                priority above 0, a sorted set of ids scored by priority * 2^49 + rank
--                (in queues written before, the whole line); its jobs of priority 0 come
--                before the list's, the others after
--   q:GROUP      the rest of the line, jobs of priority 0 only: a list in rank order, each
--                entry a rank (20 digits)
--                then an id (new ranks only ever join its tail; a job that goes back to
--                the group ranks below all of it, having been the line's first when it
--                was leased). A cancelled job's entry stays until it reaches the head,
--                where it is dropped: its job is gone or has another rank
--   j:ID         the job, flat and binary, its payload as it came (see `pack_job`);
--                `ended`: the fence of the last lease whose failure a worker reported
--   r:REQUEST    MessagePack of what a lease call with that request id took (see
--                `ops.lease`), expiring a second after its leases
--   ready        sorted set of the groups with a job waiting whose next job's priority is
--                0: score the time the group is eligible, member its order (20 digits)
--                then its name; `ready:P` the same for priority P (1 to 9), kept only
--                while it holds a group (the meta record's `lv` says which may)
--   scheduled    jobs waiting for a time: score the time, member the order then the id
--   leases       score the expiry, member the token (20 digits) then the id
--   dead         score the order of death, member the id
--   deadx        with `keep_dead_for`: the dead jobs scored by when they are dropped for
--                their age, member the order of death (20 digits) then the id
--   done         the completed jobs kept readable (`keep_completed`), scored by when they
--                are dropped (their end plus `keep_completed_for`, or 2^52 µs), member
--                the order of their end (20 digits) then the id
--   retiring     groups with nothing waiting or active: score when they may be dropped
--   paused       the queue's own pause: the time it ends, as text (none: not paused)
--   dedup        hash: deduplication key -> when it is free again and the first job's
--                estimated start (two little-endian doubles), then that job's id
--   dedupx       the same keys scored by when they are free again (dropped by maintenance)
--   sched        hash: schedule name -> MessagePack { c, z, g, p, n }: its cron expression,
--                time zone ('' for UTC), group, payload and next tick (see `ops.fire`)
--   qgate        MessagePack { s, a, n }: the queue's own policy's state `s`, kept by
--                algorithm `a`, and `n` the earliest start it allows as of its last
--                refusal (see `queue_gate`)
--   changed      the channel a call publishes on when a job may start sooner
--   events       the channel a call publishes its events on, while `watch` exists: each
--                message the count of messages so far (`evcount`, a double), then the
--                call's events (see `events_out`)
--   evcount      how many messages went out on `events`
--   watch        set (expiring) by a listener of the events: see `events_out`
--
-- `ready`, `scheduled`, `leases` and `retiring` each hold `KEEP`, scored +inf (see there).
--
-- Records written by earlier versions (MessagePack maps; the meta record's earlier binary
-- layout) are read as they are and written back in these layouts when a call changes
-- them: a queue moves to the new layout as it is used, with nothing to run.
--
-- What a job costs the server is mostly the Lua around the commands: every string made
-- (Redis's Lua hashes each byte of it), every table, every `redis.call`. Hence the flat
-- records that leases, acks and enqueues read and write without a table, the sorted sets
-- changed in bulk once a call, and one MSET and one DEL for the call's records.
--
-- Times are µs since the Unix epoch and every number is a whole number below 2^53, kept
-- exact: numbers go to Redis as text made by `int`, never by Lua's own formatting (14
-- digits).
--
-- ARGV[1] is the operation, ARGV[2] the clock as `PL.clock` reads it; the rest is the
-- operation's (see each entry below). The only error replies come before anything is
-- written (an unknown operation, a queue with no configuration): the Rust side calls again
-- after an error reply, having loaded the library, and must never apply a change twice.

local MAINTENANCE_BATCH = 1000

-- A member of `ready`, `scheduled`, `leases` and `retiring`, scored +inf, that no reader
-- takes for an entry, and no group's name (a control character, then 200 bytes): longer
-- than Redis keeps in a sorted set's compact form (a listpack, for members of up to
-- `zset-max-listpack-value` bytes, 64 by default, and sets of up to 128), so that these
-- sets stay skip lists. In a listpack every insert and removal scans the whole set: with
-- a hundred groups ready, a lease's two changes of `ready` cost the server a fifth of
-- the job's lease. It also keeps the sets from ever being empty, which would delete them.
local TILDES = '~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~'
local KEEP = '\001' .. TILDES .. TILDES .. TILDES .. TILDES
local INF = 1 / 0
-- Rust's `KEPT_UNTIL_PUSHED_OUT`: how long a kept job with no age bound is kept.
local KEPT_UNTIL_PUSHED_OUT = 2 ^ 52
-- Rust's `UNTIL_RESUMED`: the end of a pause that lasts until resumed.
local UNTIL_RESUMED = 2 ^ 53 - 1
local MAX_PROJECTION_STEPS = 64
-- A job's place in its group's line is priority * PRIO_UNIT + rank (Rust's `line_key`):
-- ranks, taken from `meta.seq`, stay below 2^49.
local PRIO_UNIT = 2 ^ 49
-- Rust's `too_costly_error`: the error kept on a job whose cost its policies can never
-- admit.
local function too_costly_error(cost)
  return 'its cost, ' .. cost .. ', is more than its group\'s policy or the queue\'s can ' ..
    'ever admit (the policy changed since it was enqueued): set a policy that admits it and ' ..
    'retry it from the dead set, or purge it'
end

local int, padded = PL.int, PL.padded

-- The call's state: the base key, the time, the queue's meta and config, and the objects
-- read so far (false: known absent), written back by `flush`.
local base, now, meta, config
local groups, jobs, deleted_jobs, dropped_groups, policy_cache
-- The default policy, once read, and whether any group has one of its own in the
-- configuration, and whether any has one set at run time (nil: not asked yet), for this
-- call.
local default_policy, overrides, run_time
-- Each object's record as read (by key suffix): `flush` writes only those that changed.
local read_as

-- The time of the last maintenance that left nothing due (nil: none this call).
local maintained_at

-- The entries of `ready` a lease has yet to add (score, member, ...), or nil when each
-- entry is added at once: see `ops.lease`.
local ready_adds

-- The queue's own policy's record as this call read it (nil: not read yet), and whether a
-- lease changed it (see `queue_gate`).
local gate, gate_changed

local function copy(t)
  if t == nil then
    return nil
  end
  return cmsgpack.unpack(cmsgpack.pack(t))
end

-- A configuration record, unpacked, remembered for the records of earlier calls (at most
-- 64): a queue's configuration rarely changes, and finding it costs less than unpacking it.
-- A configuration is only ever read, never changed in place (`config` replaces it).
local unpack_config = PL.memo(64, function(raw)
  return cmsgpack.unpack(raw)
end)

-- Group records changed by earlier calls, unpacked, by their bytes: a group read again as
-- the last call that changed it wrote it (a busy group, from call to call) costs a lookup
-- instead of an unpack, its bytes being all the record holds. A call takes the table it
-- finds out of the cache (it may change it), and `flush` puts back each group record it
-- changed and wrote, with its table, so a call that fails half-way leaves nothing changed
-- behind; groups only read (a `stats` of every group) are not put back, so they do not
-- push the busy ones out. Up to GROUPS_KEPT, all dropped when full: kept small, because
-- records kept alive cost the Lua collector more than their unpacking saves once a
-- queue's busy groups outnumber them (measured with 10,000 groups: a cache of 4,096
-- slowed every cell by a tenth to a quarter, one of 256 changed none), and job records,
-- each read once or twice, are not kept at all (kept, they slowed the single enqueues by
-- a fifth; kept only when leased, for the ack that follows, they saved nothing).
local GROUPS_KEPT = 256
local records, records_kept = {}, 0

-- A group record in its flat layout, for a group whose policy states are `gcra`'s (a TAT
-- each) or none, as most are: a tag byte ('H'), 14 little-endian doubles (n, active,
-- idle_at, next_at, paused_until, f, x, ra, ro, rt, the state's TAT, and the projection's
-- last, covers and TAT; -1 for none, and the projection's last -1 for no projection),
-- then whether each of the two states is `gcra`'s, then two doubles: `c`, how many of
-- its waiting jobs cost more than 1, and `rl`, the priority of the ready set its entry is
-- in. It costs the server half of what a MessagePack map of the same group does to write,
-- and a group is written at every lease and ack of its jobs. Any other group is a
-- MessagePack map (first byte 0x80 and up). A group whose `c` and `rl` are 0 is written in
-- the layout before them (tag 'G'), as most are.
local GROUP_TAG, GROUP_LAYOUT = 72, '<BddddddddddddddBBdd'
local GROUP_TAG_BEFORE, GROUP_LAYOUT_BEFORE = 71, '<BddddddddddddddBB'

local function gcra_shaped(alg, state)
  return alg == 'gcra' or (alg == nil and state == nil)
end

local function pack_group(g)
  local p = g.p
  if not (gcra_shaped(g.alg, g.state) and (p == nil or gcra_shaped(p.alg, p.s))) then
    return cmsgpack.pack(g)
  end
  local state, ps = g.state, p and p.s
  if (g.c or 0) == 0 and (g.rl or 0) == 0 then
    -- No costly job waiting and a next job of priority 0: the layout before `c` and `rl`.
    return struct.pack(GROUP_LAYOUT_BEFORE, GROUP_TAG_BEFORE, g.n, g.active, g.idle_at,
      g.next_at, g.paused_until, g.f or -1, g.x or -1, g.ra or -1, g.ro or -1, g.rt or -1,
      state and state[1] or -1, p and p.last or -1, p and p.covers or -1, ps and ps[1] or -1,
      g.alg and 1 or 0, p and p.alg and 1 or 0)
  end
  return struct.pack(GROUP_LAYOUT, GROUP_TAG, g.n, g.active, g.idle_at, g.next_at,
    g.paused_until, g.f or -1, g.x or -1, g.ra or -1, g.ro or -1, g.rt or -1,
    state and state[1] or -1, p and p.last or -1, p and p.covers or -1, ps and ps[1] or -1,
    g.alg and 1 or 0, p and p.alg and 1 or 0, g.c or 0, g.rl or 0)
end

local function unopt(x)
  if x < 0 then
    return nil
  end
  return x
end

local function unpack_group(raw)
  local object = records[raw]
  if object then
    records[raw] = nil
    records_kept = records_kept - 1
    return object
  end
  local tag = raw:byte(1)
  local _, n, active, idle_at, next_at, paused_until, f, x, ra, ro, rt, tat, last, covers, ptat,
    alg, palg, c, rl
  if tag == GROUP_TAG then
    _, n, active, idle_at, next_at, paused_until, f, x, ra, ro, rt, tat, last, covers, ptat,
      alg, palg, c, rl = struct.unpack(GROUP_LAYOUT, raw)
  elseif tag == GROUP_TAG_BEFORE then
    _, n, active, idle_at, next_at, paused_until, f, x, ra, ro, rt, tat, last, covers, ptat,
      alg, palg = struct.unpack(GROUP_LAYOUT_BEFORE, raw)
    c, rl = 0, 0
  else
    return cmsgpack.unpack(raw)
  end
  local p
  if last >= 0 then
    p = { s = ptat >= 0 and { ptat } or nil, alg = palg == 1 and 'gcra' or nil, last = last,
      covers = covers }
  end
  return {
    n = n, active = active, idle_at = idle_at, next_at = next_at, paused_until = paused_until,
    f = unopt(f), x = unopt(x), ra = unopt(ra), ro = unopt(ro), rt = unopt(rt),
    state = tat >= 0 and { tat } or nil, alg = alg == 1 and 'gcra' or nil, p = p, c = c,
    rl = rl,
  }
end

-- A job's record: a tag byte ('J'), its place (1 waiting, 2 scheduled, 3 active, 4 dead),
-- whether it goes back to the head of its line (0: not said, 1: no, 2: yes) and whether
-- it has an error, then 12 little-endian doubles (rank, attempts, max_attempts,
-- enqueued_at, estimated_start, token, started, expires, at, order, ended, dead_order; -1
-- for none), then four strings, each after its length: group, worker, last_error and
-- payload, then its priority (a byte) and its cost (a double), then a byte of flags (1: a
-- progress report, 2: a result) and the two strings after their lengths. Completed and dead
-- jobs keep when they ended in `at`, completed ones the order of their end in `order`. A
-- lease and an ack read and write it without making a table of it (see `ops.lease` and `ops.ack`): a table made and
-- packed per job was the largest part of their time. A job whose priority, cost, progress
-- and result are the defaults (0, 1, none, none) is written without them, in the layout
-- before them (tag 'J'), which both fast paths read too. MessagePack maps (first byte 0x80
-- and up: jobs written before) are read as tables, and written back in these layouts.
local JOB_TAG = 75
local JOB_LAYOUT = '<BBBBddddddddddddI4c0I4c0I4c0I4c0BdBI4c0I4c0'
local JOB_TAG_BEFORE, JOB_LAYOUT_BEFORE = 74, '<BBBBddddddddddddI4c0I4c0I4c0I4c0'
-- The record up to its group: what an ack needs.
local JOB_HEAD = '<BBBBddddddddddddI4c0'
local PLACE_CODE = { waiting = 1, scheduled = 2, active = 3, dead = 4, completed = 5 }
local PLACE_NAME = { 'waiting', 'scheduled', 'active', 'dead', 'completed' }

local function opt(x)
  return x or -1
end

-- A job's record from its fields in the layout's order (-1 for a number that is none,
-- '' for a string), the one place the layout is written.
local function job_record(place, head, has_error, rank, attempts, max_attempts, enqueued_at,
                          estimate, token, started, expires, at, order, ended, dead_order,
                          group, worker, err, payload, priority, cost, flags, progress,
                          result)
  if priority == 0 and cost == 1 and flags == 0 then
    -- The fields after the payload at their defaults: the layout before them, shorter and
    -- cheaper to write (most jobs).
    return struct.pack(JOB_LAYOUT_BEFORE, JOB_TAG_BEFORE, place, head, has_error, rank,
      attempts, max_attempts, enqueued_at, estimate, token, started, expires, at, order, ended,
      dead_order, #group, group, #worker, worker, #err, err, #payload, payload)
  end
  return struct.pack(JOB_LAYOUT, JOB_TAG, place, head, has_error, rank, attempts,
    max_attempts, enqueued_at, estimate, token, started, expires, at, order, ended,
    dead_order, #group, group, #worker, worker, #err, err, #payload, payload, priority, cost,
    flags, #progress, progress, #result, result)
end

local function pack_job(j)
  local head = 0
  if j.head ~= nil then
    head = j.head and 2 or 1
  end
  return job_record(PLACE_CODE[j.place], head, j.last_error and 1 or 0, j.rank or 0,
    j.attempts, j.max_attempts, j.enqueued_at, opt(j.estimated_start), opt(j.token),
    opt(j.started), opt(j.expires), opt(j.at), opt(j.order), opt(j.ended), opt(j.dead_order),
    j.group, j.worker or '', j.last_error or '', j.payload, j.priority or 0, j.cost or 1,
    (j.progress and 1 or 0) + (j.result and 2 or 0), j.progress or '', j.result or '')
end

local function unpack_job(raw)
  local tag = raw:byte(1)
  local _, place, head, has_error, rank, attempts, max_attempts, enqueued_at, estimate, token,
    started, expires, at, order, ended, dead_order, group, worker, err, payload, priority, cost,
    flags, progress, result
  if tag == JOB_TAG then
    _, place, head, has_error, rank, attempts, max_attempts, enqueued_at, estimate, token,
      started, expires, at, order, ended, dead_order, group, worker, err, payload, priority,
      cost, flags, progress, result = struct.unpack(JOB_LAYOUT, raw)
  elseif tag == JOB_TAG_BEFORE then
    _, place, head, has_error, rank, attempts, max_attempts, enqueued_at, estimate, token,
      started, expires, at, order, ended, dead_order, group, worker, err, payload =
      struct.unpack(JOB_LAYOUT_BEFORE, raw)
    priority, cost = 0, 1
  else
    local j = cmsgpack.unpack(raw)
    j.priority, j.cost = j.priority or 0, j.cost or 1
    return j
  end
  local head_flag
  if head > 0 then
    head_flag = head == 2
  end
  return {
    group = group, rank = rank, payload = payload, attempts = attempts,
    max_attempts = max_attempts, enqueued_at = enqueued_at, place = PLACE_NAME[place],
    estimated_start = unopt(estimate), token = unopt(token), started = unopt(started),
    expires = unopt(expires), worker = place == 3 and worker or nil, at = unopt(at),
    order = unopt(order), head = head_flag, ended = unopt(ended),
    dead_order = unopt(dead_order), last_error = has_error == 1 and err or nil,
    priority = priority, cost = cost,
    progress = flags and flags % 2 == 1 and progress or nil,
    result = flags and flags >= 2 and result or nil,
  }
end

local function keep_group(raw, object)
  if records[raw] == nil then
    if records_kept >= GROUPS_KEPT then
      records, records_kept = {}, 0
    end
    records_kept = records_kept + 1
  end
  records[raw] = object
end

-- The meta record: a tag byte ('m') and 13 little-endian doubles (exact for whole numbers
-- below 2^53): seq, last_id, now, jobs, due (-1: unknown), then the totals enqueued,
-- started, acked, failed, retried, dead, lease_expiries and pauses, then `lv`: which ready
-- sets may hold a group, bit P for priority P (bit 0, `ready`, always). Every call reads
-- and writes it: binary, it costs the server a fraction of a MessagePack map's work. A
-- MessagePack map (first byte 0x80 and up: queues written before) is read as one.
local META_TAG, META_LAYOUT = 111, '<Bddddddddddddddd'
-- A queue whose `lv` is 1 is written in the layout before it (tag 'n'); the one before
-- `rdue` (tag 'm') is read, and written back in these.
local META_TAG_LV, META_LAYOUT_LV = 110, '<Bdddddddddddddd'
local META_TAG_BEFORE, META_LAYOUT_BEFORE = 109, '<Bddddddddddddd'

local function read_meta(raw)
  if not raw then
    return {
      seq = 0, last_id = 0, now = 0, jobs = 0, lv = 1,
      totals = { enqueued = 0, started = 0, acked = 0, failed = 0, retried = 0, dead = 0,
        lease_expiries = 0, pauses = 0 },
    }
  end
  local tag = raw:byte(1)
  local _, seq, last_id, t, jobs, due, rdue, a, b, c, d, e, f, g, h, lv
  if tag == META_TAG then
    _, seq, last_id, t, jobs, due, rdue, a, b, c, d, e, f, g, h, lv =
      struct.unpack(META_LAYOUT, raw)
  elseif tag == META_TAG_LV then
    _, seq, last_id, t, jobs, due, rdue, a, b, c, d, e, f, g, h = struct.unpack(META_LAYOUT_LV, raw)
  elseif tag == META_TAG_BEFORE then
    _, seq, last_id, t, jobs, due, a, b, c, d, e, f, g, h = struct.unpack(META_LAYOUT_BEFORE, raw)
    -- Unknown: the first maintenance finds it.
    due, rdue = -1, -1
  else
    local m = cmsgpack.unpack(raw)
    m.lv = m.lv or 1
    return m
  end
  return {
    seq = seq, last_id = last_id, now = t, jobs = jobs, lv = lv or 1,
    due = due >= 0 and due or nil,
    rdue = rdue >= 0 and rdue or nil,
    totals = { enqueued = a, started = b, acked = c, failed = d, retried = e, dead = f,
      lease_expiries = g, pauses = h },
  }
end

local function write_meta(m)
  local t = m.totals
  if (m.lv or 1) == 1 then
    -- No ready set of a priority above 0: the layout before `lv`.
    return struct.pack(META_LAYOUT_LV, META_TAG_LV, m.seq, m.last_id, m.now, m.jobs,
      m.due or -1, m.rdue or -1, t.enqueued, t.started, t.acked, t.failed, t.retried, t.dead,
      t.lease_expiries, t.pauses)
  end
  return struct.pack(META_LAYOUT, META_TAG, m.seq, m.last_id, m.now, m.jobs, m.due or -1,
    m.rdue or -1, t.enqueued, t.started, t.acked, t.failed, t.retried, t.dead, t.lease_expiries,
    t.pauses, m.lv or 1)
end

local function begin(KEYS, clock_arg)
  base = KEYS[1]
  local t = PL.clock(clock_arg)
  groups, jobs, deleted_jobs, dropped_groups, policy_cache, read_as = {}, {}, {}, {}, {}, {}
  default_policy, overrides, run_time = nil, nil, nil
  -- A call that failed half-way may have left a lease's buffer behind.
  ready_adds = nil
  gate, gate_changed = nil, false
  meta = read_meta(redis.call('GET', base .. 'meta') or nil)
  local raw = redis.call('GET', base .. 'config')
  config = unpack_config(raw or nil)
  return t
end

-- The call's events (Rust's `Event`), packed, published on the channel `events` when it
-- ends, while someone listens: `watched` is nil until the call's first event asks whether
-- anyone does (the key `watch`, which a listener sets for `WATCH_FOR`), so a queue nobody
-- watches pays one EXISTS a call that has events, and builds none. Each event is its kind's
-- code (Rust's `EventKind::code`), its time, attempt and `at` (-1: none) as doubles, then
-- its id, group, worker and error, each a 4-byte length (2^32 - 1: none) then the bytes.
local events_out, watched = {}, nil
local NONE_TEXT = '\255\255\255\255'
local function text_of(s)
  if not s then
    return NONE_TEXT
  end
  return struct.pack('<I4', #s) .. s
end
local EV = { enqueued = 1, started = 2, acked = 3, failed = 4, retried = 5, dead = 6,
  lease_expired = 7, paused = 8 }
local function emit(code, id, group, attempt, at, worker, err)
  if watched == nil then
    watched = redis.call('EXISTS', base .. 'watch') == 1
  end
  if watched then
    events_out[#events_out + 1] = struct.pack('<Bddd', code, now, attempt or -1, at or -1)
      .. text_of(id) .. text_of(group) .. text_of(worker) .. text_of(err)
  end
end

-- Time never goes back inside the queue.
local function tick(t)
  if t > meta.now then
    meta.now = t
  end
  now = meta.now
  return now
end

-- `int(t)`, the call's time printed once a call (a time printed costs the server a C
-- library call): most scores and bounds a call writes are its time.
local now_text, now_printed
local function int_at(t)
  if t == now then
    if now_printed ~= now then
      now_text, now_printed = int(now), now
    end
    return now_text
  end
  return int(t)
end

local function next_seq()
  meta.seq = meta.seq + 1
  return meta.seq
end

-- Puts `member` in `set` ('leases', 'scheduled', 'dedupx' or 'retiring'), due at `at`:
-- every entry of these goes in here, so that `meta.due` stays at or before the first of
-- them (an entry taken out early leaves it earlier than need be, which costs one
-- maintenance).
local function add_due(set, at, member)
  redis.call('ZADD', base .. set, int_at(at), member)
  if set == 'retiring' then
    if meta.rdue and at < meta.rdue then
      meta.rdue = at
    end
  elseif meta.due and at < meta.due then
    meta.due = at
  end
end

-- Appends to `writes` (key, record, ...) the objects of `cache` (kept under `prefix`) that
-- changed since they were read, and to `gone` the names `removed` names.
local function write_back(cache, prefix, removed, writes, gone)
  for key, object in pairs(cache) do
    if object then
      -- Lua's strings are interned: comparing them costs nothing.
      local record = prefix == 'g:' and pack_group(object) or pack_job(object)
      if record ~= read_as[prefix .. key] then
        writes[#writes + 1] = base .. prefix .. key
        writes[#writes + 1] = record
        if prefix == 'g:' then
          keep_group(record, object)
        end
      end
    elseif removed[key] then
      gone[#gone + 1] = key
    end
  end
end

-- Calls `command` on `first` (nil: none) then the values of `list`, `step` of them a call
-- (a Lua call takes a few thousand values at most).
local function call_in_chunks(command, first, list, step)
  for from = 1, #list, step do
    local last = min(from + step - 1, #list)
    if first then
      redis.call(command, first, unpack(list, from, last))
    else
      redis.call(command, unpack(list, from, last))
    end
  end
end

local function flush()
  -- Every record in one MSET, every key removed in one DEL, where there was a command
  -- for each.
  local writes, dropped, deleted = { base .. 'meta', write_meta(meta) }, {}, {}
  write_back(groups, 'g:', dropped_groups, writes, dropped)
  write_back(jobs, 'j:', deleted_jobs, writes, deleted)
  call_in_chunks('MSET', nil, writes, 2000)
  local keys = {}
  for _, name in ipairs(dropped) do
    keys[#keys + 1] = base .. 'g:' .. name
    keys[#keys + 1] = base .. 'l:' .. name
    keys[#keys + 1] = base .. 'q:' .. name
  end
  for _, id in ipairs(deleted) do
    keys[#keys + 1] = base .. 'j:' .. id
  end
  call_in_chunks('DEL', nil, keys, 2000)
  call_in_chunks('SREM', base .. 'groups', dropped, 2000)
end

-- The object `key` of `cache` (`jobs`, kept under 'j:', or `groups`, under 'g:'), read
-- from Redis once a call; nil if there is none.
local function load(cache, prefix, key)
  local object = cache[key]
  if object == nil then
    local raw = redis.call('GET', base .. prefix .. key)
    if not raw then
      object = false
    elseif prefix == 'g:' then
      object = unpack_group(raw)
    else
      object = unpack_job(raw)
    end
    cache[key] = object
    read_as[prefix .. key] = raw
  end
  return object or nil
end

local function load_job(id)
  return load(jobs, 'j:', id)
end

local function remove_job(id)
  jobs[id] = false
  deleted_jobs[id] = true
  meta.jobs = meta.jobs - 1
end

local function load_group(name)
  return load(groups, 'g:', name)
end

-- The group, created if the queue holds none of that name. `n` is the number of jobs in
-- its line, `f` the length of its front, `l:GROUP` (nil: not known, in groups written
-- before), `x` the entries of cancelled jobs in its list, `q:GROUP` (nil: none); `state`
-- its policy's state, kept by algorithm `alg`; `ra`, `ro` its entry in `ready`; `rt` its
-- entry in `retiring`; `p` its projection { s, alg, last, covers } (see `projection`).
local function group_entry(name)
  local g = load_group(name)
  if not g then
    g = { n = 0, active = 0, idle_at = 0, next_at = 0, paused_until = 0, f = 0 }
    groups[name] = g
    -- A group dropped earlier in this call (its record gone, the keys not yet deleted)
    -- may leave cancelled jobs' entries in its list: none is this group's.
    if dropped_groups[name] then
      redis.call('DEL', base .. 'l:' .. name, base .. 'q:' .. name)
    end
    dropped_groups[name] = nil
    redis.call('SADD', base .. 'groups', name)
  end
  return g
end

-- The length of group `name`'s front (`g` its record), asked of Redis once for a group
-- written before it was kept.
local function front_of(name, g)
  if not g.f then
    g.f = redis.call('ZCARD', base .. 'l:' .. name)
  end
  return g.f
end

-- How many more entries of cancelled jobs this lease may drop.
local drops_left = 0

-- The id of group `name`'s next job, and whether it is in the front; nil if the line is
-- empty; `true` for the list's head when the list holds no cancelled job's entry (`g.x`
-- counts them), which needs no look. Cancelled jobs' entries at the list's head are
-- dropped on the way, MAINTENANCE_BATCH of them a lease at most (`drops_left`): once
-- they are spent, nil and true (the rest next call).
local function next_job(name, g)
  if front_of(name, g) > 0 then
    local e = redis.call('ZRANGE', base .. 'l:' .. name, '0', '0', 'WITHSCORES')
    if not e[1] then
      g.f = 0
    elseif g.n <= g.f or tonumber(e[2]) < PRIO_UNIT then
      -- The front's first is of priority 0, or the list holds no job (of priority 0).
      return e[1], true
    end
  end
  if (g.x or 0) == 0 then
    return g.n > 0 or nil
  end
  local key = base .. 'q:' .. name
  while true do
    local entry = redis.call('LINDEX', key, '0')
    if not entry then
      g.x = 0
      return nil
    end
    local id = entry:sub(21)
    local job = load_job(id)
    if job and job.place == 'waiting' and job.rank == tonumber(entry:sub(1, 20)) then
      return id, false
    end
    if drops_left == 0 then
      return nil, true
    end
    redis.call('LPOP', key)
    g.x = g.x - 1
    drops_left = drops_left - 1
  end
end

-- A policy from its arguments as the Rust side wrote them (`queue_policy_args`): the
-- algorithm's, then the most a start may cost (`mc`; '' or none: any cost).
local function read_policy(args)
  local policy, after = PL.read_policy(args, 1)
  if policy then
    policy.mc = tonumber(args[after])
  end
  return policy
end

local function policy_of(name)
  local policy = policy_cache[name]
  if not policy then
    if overrides == nil then
      -- Whether any group has a policy of its own, asked once a call.
      overrides = redis.call('EXISTS', base .. 'policies') == 1
      run_time = redis.call('EXISTS', base .. 'rpolicies') == 1
    end
    local raw = run_time and redis.call('HGET', base .. 'rpolicies', name)
    if not raw and overrides then
      raw = redis.call('HGET', base .. 'policies', name)
    end
    if raw then
      policy = read_policy(cmsgpack.unpack(raw))
    else
      -- The default, read once a call and shared (a policy is never changed once read).
      default_policy = default_policy or read_policy(config.default)
      policy = default_policy
    end
    policy_cache[name] = policy
  end
  return policy
end

-- The first entry of a sorted set: its member and score, or nil.
local function first(key)
  local e = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
  if e[1] then
    return e[1], tonumber(e[2])
  end
  return nil
end

-- The earliest score in the sorted sets `sets` (their suffixes), `KEEP` aside; nil if
-- none has an entry.
local function earliest(sets)
  local best
  for _, set in ipairs(sets) do
    local _, at = first(base .. set)
    if at and at < INF and (not best or at < best) then
      best = at
    end
  end
  return best
end

-- Rust's `round_to_micros(micros_to_duration(us))`.
local function round_micros(us)
  return floor((round_nanos(us) + 500) / 1000)
end

-- Rust's `micros_up(micros_to_duration(us))`: whole µs rounded up, at least 1.
local function micros_up(us)
  local ns = round_nanos(us)
  local whole = floor((ns + 500) / 1000)
  if whole * 1000 < ns then
    return whole + 1
  end
  return max(whole, 1)
end

-- `policy.apply(&mut state, t, Op::Limit, cost)` on a state kept by algorithm `alg`:
-- another algorithm's state counts as none, and stays unless the decision writes one of its
-- own. Answers allowed, delay, reset_after, and the state and its algorithm after.
local function apply(policy, state, alg, t, cost)
  local own = alg == policy.alg and state or nil
  local allowed, delay, _, reset_after, new_state = policy.f(policy.p, own, t, 'limit', cost,
    nil, nil)
  if new_state then
    return allowed, delay, reset_after, new_state, policy.alg
  end
  return allowed, delay, reset_after, state, alg
end

-- Runs the policy forward to the next start, of a job costing `cost`, after the
-- projection's last; returns it.
local function project_one(policy, p, t0, cost)
  local t = max(p.last, t0)
  -- A cost the policy can never admit: Rust's `apply` refuses it as an error, and the
  -- projection stops where it is.
  local steps = (policy.mc and cost > policy.mc) and 0 or MAX_PROJECTION_STEPS
  for _ = 1, steps do
    local allowed, delay, _, state, alg = apply(policy, p.s, p.alg, t, cost)
    p.s, p.alg = state, alg
    if allowed then
      break
    end
    t = t + micros_up(delay)
  end
  p.last = t
  p.covers = p.covers + 1
  return t
end

-- The ids of the first `upto` jobs of group `name`'s line, in its order: the front's of
-- priority 0, the list's (entries of cancelled jobs aside), then the rest of the front.
local function line_ids(name, g, upto)
  local ids = {}
  local front = {}
  if front_of(name, g) > 0 then
    front = redis.call('ZRANGE', base .. 'l:' .. name, '0', '-1', 'WITHSCORES')
  end
  local k = 1
  while k <= #front and #ids < upto and tonumber(front[k + 1]) < PRIO_UNIT do
    ids[#ids + 1] = front[k]
    k = k + 2
  end
  if #ids < upto and g.n > g.f then
    for _, entry in ipairs(redis.call('LRANGE', base .. 'q:' .. name, '0', '-1')) do
      if #ids >= upto then
        break
      end
      local id = entry:sub(21)
      local job = load_job(id)
      if job and job.place == 'waiting' and job.rank == tonumber(entry:sub(1, 20)) then
        ids[#ids + 1] = id
      end
    end
  end
  while k <= #front and #ids < upto do
    ids[#ids + 1] = front[k]
    k = k + 2
  end
  return ids
end

-- The costs of the first `upto` jobs of group `name`'s line, in its order.
local function line_costs(name, g, upto)
  local costs = {}
  for i, id in ipairs(line_ids(name, g, upto)) do
    local job = load_job(id)
    costs[i] = job and job.cost or 1
  end
  return costs
end

-- The projection of the first `upto` jobs of the group's line (nil: all), each at its
-- cost: the group's own when it covers the whole line (a copy, or with `own` the group's
-- own, for a caller that stores what it gets back), else run afresh from its state.
local function projection(name, g, t, own, upto)
  upto = upto or g.n
  if g.p and upto == g.n and g.p.covers == g.n then
    return own and g.p or copy(g.p)
  end
  local p = {
    s = copy(g.state), alg = g.alg, last = max(t, g.next_at, g.paused_until), covers = 0,
  }
  local policy = policy_of(name)
  if (g.c or 0) == 0 then
    for _ = 1, upto do
      project_one(policy, p, t, 1)
    end
  else
    local costs = line_costs(name, g, upto)
    for i = 1, upto do
      project_one(policy, p, t, costs[i] or 1)
    end
  end
  return p
end

-- How many of group `name`'s waiting jobs a job of `priority` joining it would have ahead:
-- all but the front's of a larger priority.
local function ahead_of(name, g, priority)
  if priority >= 9 or front_of(name, g) == 0 then
    return g.n
  end
  return g.n - redis.call('ZCOUNT', base .. 'l:' .. name, int((priority + 1) * PRIO_UNIT),
    '+inf')
end

-- When a job of `priority` costing `cost` would start if it joined group `name`'s line now,
-- behind every job of its priority or a more urgent one, without adding it.
local function peek_place(name, t, priority, cost)
  local g = load_group(name)
  local p
  if g then
    p = projection(name, g, t, false, ahead_of(name, g, priority))
  else
    p = { last = t, covers = 0 }
  end
  return project_one(policy_of(name), p, t, cost)
end

-- The tail's projection when a job costing `cost` joins the line ahead of the tail: one
-- more step keeps the tail's estimate in step without replaying the line.
local function one_more_ahead(name, g, cost)
  if g.p and g.p.covers == g.n then
    project_one(policy_of(name), g.p, now, cost)
  else
    g.p = nil
  end
end

-- The ready set of the groups whose next job has priority `level`.
local function ready_key(level)
  if level == 0 then
    return base .. 'ready'
  end
  return base .. 'ready:' .. level
end

-- Whether bit `level` of `meta.lv` is set: the ready set of that priority may hold a group.
local function level_used(level)
  return floor(meta.lv / 2 ^ level) % 2 == 1
end

-- The ready sets' priorities that may hold a group, most urgent first.
local function levels_used()
  local out = { 0 }
  if meta.lv > 1 then
    for level = 1, 9 do
      if level_used(level) then
        out[#out + 1] = level
      end
    end
  end
  return out
end

-- The ready set a lease is taking groups from (see `ops.lease`).
local ready_level = 0

-- Adds the entries `ready_adds` holds to the ready set of `ready_level`, in one command.
local function add_ready()
  if ready_adds and #ready_adds > 0 then
    redis.call('ZADD', ready_key(ready_level), unpack(ready_adds))
    ready_adds = {}
  end
end

-- Puts the entries of the ready set of `ready_level` a ZPOPMIN answered (`taken`, member
-- then score) from `from` on back as they were.
local function put_back(taken, from)
  local back = {}
  for k = from, #taken, 2 do
    back[#back + 1] = taken[k + 1]
    back[#back + 1] = taken[k]
  end
  if #back > 0 then
    redis.call('ZADD', ready_key(ready_level), unpack(back))
  end
end

-- The priority of group `name`'s next job (0 for an empty line): 0 when the list holds a
-- job or the front's first is of priority 0.
local function level_of(name, g)
  if g.n == 0 or front_of(name, g) == 0 or g.n > g.f then
    return 0
  end
  local _, score = first(base .. 'l:' .. name)
  return score and floor(score / PRIO_UNIT) or 0
end

-- Puts the group in or out of the ready and retiring sets as its state says (`g` its
-- record, if the caller has it).
local function refresh(name, g)
  g = g or load_group(name)
  if not g then
    return
  end
  local cap = config.gc
  local ready = g.n > 0 and (cap == 0 or g.active < cap)
  local at = max(g.next_at, g.paused_until)
  -- An empty front (most groups) has a next job of priority 0 without a call.
  local level = ready and g.f ~= 0 and level_of(name, g) or 0
  if g.ra then
    -- A group stays where it is unless it leaves the set, must wait longer or its next
    -- job's priority changed.
    if not ready or g.ra < at or (g.rl or 0) ~= level then
      redis.call('ZREM', ready_key(g.rl or 0), padded(g.ro) .. name)
      g.ra, g.ro = nil, nil
    end
  end
  if ready and not g.ra then
    local order = next_seq()
    g.ra, g.ro, g.rl = max(at, now), order, level
    if ready_adds and level == ready_level then
      local n = #ready_adds
      ready_adds[n + 1], ready_adds[n + 2] = int_at(g.ra), padded(order) .. name
    else
      redis.call('ZADD', ready_key(level), int_at(g.ra), padded(order) .. name)
      if level > 0 and not level_used(level) then
        meta.lv = meta.lv + 2 ^ level
      end
    end
  end
  local empty = g.n == 0 and g.active == 0
  if g.rt and not empty then
    redis.call('ZREM', base .. 'retiring', name)
    g.rt = nil
  elseif not g.rt and empty then
    g.rt = max(g.idle_at, g.paused_until)
    add_due('retiring', g.rt, name)
    if g.rt <= now then
      -- Due at once: the next maintenance of this call must see it.
      maintained_at = nil
    end
  end
  if g.n == 0 then
    g.p = nil
  end
end

-- Puts `id`, of `priority` and costing `cost`, in the group's line with a new rank, behind
-- every job of its priority or a more urgent one (a job of priority 0 at the list's tail,
-- any other in the front); returns its estimated start and its rank.
local function join_tail(name, id, t, priority, cost)
  local rank = next_seq()
  local g = groups[name] or group_entry(name)
  -- Most jobs: priority 0 in a group whose front is empty, which has the whole line ahead
  -- and whose own projection covers it (`ahead_of` and `projection` without their calls).
  local ahead, p
  if priority == 0 and g.f == 0 then
    ahead = g.n
  else
    ahead = ahead_of(name, g, priority)
  end
  p = g.p
  if not (p and ahead == g.n and p.covers == ahead) then
    p = projection(name, g, t, ahead == g.n, ahead)
  end
  local estimate = project_one(policy_of(name), p, t, cost)
  if ahead == g.n then
    g.p = p
  else
    one_more_ahead(name, g, cost)
  end
  if priority == 0 then
    redis.call('RPUSH', base .. 'q:' .. name, padded(rank) .. id)
  else
    local front = front_of(name, g)
    redis.call('ZADD', base .. 'l:' .. name, int(priority * PRIO_UNIT + rank), id)
    g.f = front + 1
  end
  g.n = g.n + 1
  if cost > 1 then
    g.c = (g.c or 0) + 1
  end
  refresh(name, g)
  return estimate, rank
end

-- Puts `id` back in its group's line at its place, in the front.
local function join_head(name, id)
  local job = load_job(id)
  local rank = job and job.rank or 0
  local priority, cost = job and job.priority or 0, job and job.cost or 1
  local g = group_entry(name)
  one_more_ahead(name, g, cost)
  local front = front_of(name, g)
  redis.call('ZADD', base .. 'l:' .. name, int(priority * PRIO_UNIT + rank), id)
  g.f = front + 1
  g.n = g.n + 1
  if cost > 1 then
    g.c = (g.c or 0) + 1
  end
  refresh(name)
end

-- Takes dead job `id` (`job`) out of the dead set (a retry): answers whether it was there.
local function unbury(id, job)
  if redis.call('ZREM', base .. 'dead', id) == 0 then
    return false
  end
  if config.kdf and job.dead_order then
    redis.call('ZREM', base .. 'deadx', padded(job.dead_order) .. id)
  end
  return true
end

-- Removes dead job `id` (`job`) from the dead set and the queue.
local function forget_dead(id, job)
  unbury(id, job)
  remove_job(id)
end

-- Job `id` goes to the dead set now; the oldest deaths beyond `keep_dead` leave the queue
-- (Rust's `bury`).
local function to_dead(id, job)
  local order = next_seq()
  job.place, job.dead_order, job.at = 'dead', order, now
  redis.call('ZADD', base .. 'dead', int(order), id)
  if config.kdf then
    add_due('deadx', now + config.kdf, padded(order) .. id)
  end
  if config.kd then
    local extra = redis.call('ZCARD', base .. 'dead') - config.kd
    if extra > 0 then
      for _, oldest in ipairs(redis.call('ZRANGE', base .. 'dead', '0', int(extra - 1))) do
        local gone = load_job(oldest)
        if gone then
          forget_dead(oldest, gone)
        else
          redis.call('ZREM', base .. 'dead', oldest)
        end
      end
    end
  end
end

-- Deletes the record of a kept completed job (not counted in `meta.jobs`).
local function drop_completed(id)
  jobs[id] = false
  deleted_jobs[id] = true
end

-- Acknowledged job `id` (`job`, out of its lease) ends now: kept readable with `result`
-- while `keep_completed` allows (the oldest beyond it leave), else gone at once (Rust's
-- `complete`).
local function complete(id, job, result)
  if (config.kc or 0) == 0 then
    remove_job(id)
    return
  end
  local order = next_seq()
  job.place, job.at, job.order, job.result = 'completed', now, order, result
  job.token, job.started, job.expires, job.worker, job.head = nil, nil, nil, nil, nil
  meta.jobs = meta.jobs - 1
  add_due('done', now + (config.kcf or KEPT_UNTIL_PUSHED_OUT), padded(order) .. id)
  local extra = redis.call('ZCARD', base .. 'done') - config.kc
  if extra > 0 then
    -- ZPOPMIN answers each member, then its score.
    local popped = redis.call('ZPOPMIN', base .. 'done', int(extra))
    for k = 1, #popped, 2 do
      drop_completed(popped[k]:sub(21))
    end
  end
end

local function to_waiting(job)
  job.place = 'waiting'
  job.token, job.started, job.expires, job.worker = nil, nil, nil, nil
  job.at, job.order, job.head = nil, nil, nil
end

-- Takes an active job out of its lease and its group's count; returns its group.
local function release(id)
  local job = load_job(id)
  if not job or job.place ~= 'active' then
    return nil
  end
  redis.call('ZREM', base .. 'leases', padded(job.token) .. id)
  local g = load_group(job.group)
  if g then
    g.active = max(g.active - 1, 0)
  end
  return job.group
end

-- A lease ran out: the job goes back to the head of its group, or dies.
local function lease_expired(id)
  local name = release(id)
  if not name then
    return false
  end
  local job = load_job(id)
  meta.totals.lease_expiries = meta.totals.lease_expiries + 1
  emit(EV.lease_expired, id, name, job.attempts)
  if job.attempts >= job.max_attempts then
    meta.totals.dead = meta.totals.dead + 1
    job.last_error = 'the lease expired on attempt ' .. job.attempts .. ' of '
      .. job.max_attempts
    emit(EV.dead, id, name, nil, nil, nil, job.last_error)
    to_waiting(job)
    to_dead(id, job)
    refresh(name)
  else
    to_waiting(job)
    join_head(name, id)
  end
  return true
end


-- The first member of the sorted set `key` due by `t` (scored at most `t`), or nil. Asked
-- by score, so that Redis sends no score back: most calls find nothing due, and a score
-- in a reply is a double printed as text and read back. (Every argument is text: Lua
-- prints a number given to `redis.call` with the C library's floating-point printing.)
local function first_due(key, t)
  return redis.call('ZRANGE', key, '-inf', int_at(t), 'BYSCORE', 'LIMIT', '0', '1')[1]
end

-- Hands each member of the sorted set `set` that is due by `t` to `handle` (with `t`),
-- which must take it out of the set: at most MAINTENANCE_BATCH. Answers whether none is
-- left due.
local function drain(set, t, handle)
  local key = base .. set
  -- Asked for at once: no handler takes out or adds another entry of the set it drains.
  local due = redis.call('ZRANGE', key, '-inf', int_at(t), 'BYSCORE', 'LIMIT', '0',
    MAINTENANCE_BATCH)
  for i = 1, #due do
    handle(due[i], t)
  end
  return #due < MAINTENANCE_BATCH or not first_due(key, t)
end

-- A completed job due to be dropped for its age.
local function expire_done(member)
  redis.call('ZREM', base .. 'done', member)
  drop_completed(member:sub(21))
end

-- A dead job due to be dropped for its age.
local function expire_dead(member)
  redis.call('ZREM', base .. 'deadx', member)
  local id = member:sub(21)
  redis.call('ZREM', base .. 'dead', id)
  if load_job(id) then
    remove_job(id)
  end
end

local function expire_lease(member)
  if not lease_expired(member:sub(21)) then
    redis.call('ZREM', base .. 'leases', member)
  end
end

-- A deduplication key due to be free: dropped if its entry is the one found due.
local function expire_dedup(member, t)
  redis.call('ZREM', base .. 'dedupx', member)
  local raw = redis.call('HGET', base .. 'dedup', member)
  if raw and struct.unpack('<d', raw) <= t then
    redis.call('HDEL', base .. 'dedup', member)
  end
end

local function schedule_due(member)
  redis.call('ZREM', base .. 'scheduled', member)
  local id = member:sub(21)
  local job = load_job(id)
  if job then
    local head = job.place == 'scheduled' and job.head
    to_waiting(job)
    if head then
      join_head(job.group, id)
    else
      local _, rank = join_tail(job.group, id, now, job.priority or 0, job.cost or 1)
      job.rank = rank
    end
  end
end

-- A group due to retire by `t`: dropped if still idle (its entry in `retiring`, scored
-- `g.rt`, is the one found due).
local function retire(name, t)
  redis.call('ZREM', base .. 'retiring', name)
  local g = load_group(name)
  if g and g.n == 0 and g.active == 0 and g.rt and g.rt <= t then
    groups[name] = false
    dropped_groups[name] = true
  end
end

-- Expired leases back to their groups, due jobs into theirs, idle groups dropped: at most
-- MAINTENANCE_BATCH of each.
local function maintain(t)
  if maintained_at == t then
    -- Nothing comes due at `t` that a finished maintenance at `t` left.
    return
  end
  -- `meta.due` bounds the first entry of `leases`, `scheduled` and `dedupx`, `meta.rdue`
  -- that of `retiring` (nil: unknown), so that a group gone idle, due at once, does not cost
  -- a look at the others.
  local work = not meta.due or t >= meta.due
  if not work and meta.rdue and t < meta.rdue then
    -- Nothing is due yet: most calls.
    maintained_at = t
    return
  end
  local finished = true
  if work then
    finished = drain('leases', t, expire_lease)
    finished = drain('scheduled', t, schedule_due) and finished
    finished = drain('dedupx', t, expire_dedup) and finished
    finished = drain('done', t, expire_done) and finished
    finished = drain('deadx', t, expire_dead) and finished
    if finished then
      -- The first entry left in any (2^53: none).
      meta.due = earliest({ 'leases', 'scheduled', 'dedupx', 'done', 'deadx' }) or 2 ^ 53
    end
  end
  -- Lease expiries and due jobs may have put groups in `retiring`, lowering `rdue`.
  if not meta.rdue or t >= meta.rdue then
    local retired = drain('retiring', t, retire)
    if retired then
      meta.rdue = earliest({ 'retiring' }) or 2 ^ 53
    end
    finished = retired and finished
  end
  maintained_at = finished and t or nil
end

-- Asks the call to publish on the queue's channel when it ends: a job may start sooner.
local wake = false

local function publish()
  wake = true
end

-- When the queue's own pause ends (0: none; maybe past).
local function queue_paused()
  return tonumber(redis.call('GET', base .. 'paused')) or 0
end

-- The queue's own policy's record { s, a, n } (see `qgate`), read once a call: nil for a
-- queue without one.
local function queue_gate()
  if not config.qp then
    return nil
  end
  if not gate then
    local raw = redis.call('GET', base .. 'qgate')
    gate = raw and cmsgpack.unpack(raw) or { n = 0 }
  end
  return gate
end

-- When the queue may next start a job, as the queue as a whole says: its pause and its own
-- policy's last refusal (0 or past: now), as `QueueCore::queue_gate`.
local function queue_opens()
  local q = queue_gate()
  return max(queue_paused(), q and q.n or 0)
end

-- The jobs leased now, when the queue has a concurrency cap (nil: none).
local function queue_active()
  if (config.qc or 0) == 0 then
    return nil
  end
  -- Below +inf: all but `KEEP`.
  return redis.call('ZCOUNT', base .. 'leases', '-inf', '(inf')
end

-- While the queue is paused, or its own policy refuses starts, its groups become eligible
-- when that ends; while its concurrency cap is reached, when a job ends.
local function next_event()
  local best = earliest({ 'scheduled', 'leases' })
  local sets = { 'ready' }
  for _, level in ipairs(levels_used()) do
    if level > 0 then
      sets[#sets + 1] = 'ready:' .. level
    end
  end
  local ready = earliest(sets)
  local active = queue_active()
  if ready and not (active and active >= config.qc) then
    ready = max(ready, queue_opens())
    if not best or ready < best then
      best = ready
    end
  end
  return best or -1
end

-- The job as `JobInfo` reads it: group, state, attempts, max_attempts, last_error ('' and
-- a 0 flag for none), enqueued_at, not_before, started, lease_expires (-1: none), worker,
-- payload, priority, cost, progress and result (each a 1 flag then the bytes; 0 and '' for
-- none), and when it ended (-1: not completed or dead).
local function job_reply(id, job, out)
  out[#out + 1] = id
  out[#out + 1] = job.group
  out[#out + 1] = job.place
  out[#out + 1] = job.attempts
  out[#out + 1] = job.max_attempts
  out[#out + 1] = job.last_error and 1 or 0
  out[#out + 1] = job.last_error or ''
  out[#out + 1] = job.enqueued_at
  out[#out + 1] = job.place == 'scheduled' and job.at or -1
  out[#out + 1] = job.place == 'active' and job.started or -1
  out[#out + 1] = job.place == 'active' and job.expires or -1
  out[#out + 1] = job.place == 'active' and job.worker or ''
  out[#out + 1] = job.payload
  out[#out + 1] = job.priority or 0
  out[#out + 1] = job.cost or 1
  out[#out + 1] = job.progress and 1 or 0
  out[#out + 1] = job.progress or ''
  out[#out + 1] = job.result and 1 or 0
  out[#out + 1] = job.result or ''
  local ended = job.place == 'dead' or job.place == 'completed'
  out[#out + 1] = ended and job.at or -1
end

local ops = {}

-- config FP SPEC DEFAULT_N DEFAULT... OVERRIDES (NAME GROUP_SPEC N ARGS...)... GC MA LEASE BO
-- BO_MAX MAX_JOBS MAX_PAYLOAD QC QSPEC QN QARGS... KC KCF KD KDF [PARTITIONS SUFFIX]: the
-- default policy's spec and arguments, each group's own, the settings (durations in µs), the
-- queue's own concurrency cap and policy (QSPEC '' and QN 0 for none), what it keeps of ended
-- jobs (`keep_completed`, `keep_completed_for`, `keep_dead`, `keep_dead_for`; '' for no
-- bound); for a queue of several partitions,
-- their number and what the ids this partition gives end with. Stores the configuration
-- unless it is the one stored (same fingerprint); a changed one applies to every group as
-- `QueueCore::set_config` does. Answers 1 if it changed; -1 then the stored number of
-- partitions, changing nothing else, if PARTITIONS (none: 1) is another.
function ops.config(ARGV, o)
  -- Every handle configures the queue when it opens it: queues of earlier versions get
  -- `KEEP` too.
  for _, set in ipairs({ 'ready', 'scheduled', 'leases', 'retiring' }) do
    redis.call('ZADD', base .. set, '+inf', KEEP)
  end
  local fp = ARGV[o + 3]
  if config and config.fp == fp then
    return { now, 0 }
  end
  -- The partitions, after the settings (`s + 1` is GC): a queue's never change.
  local s = o + 6 + tonumber(ARGV[o + 5])
  for _ = 1, tonumber(ARGV[s]) do
    s = s + 3 + tonumber(ARGV[s + 3])
  end
  -- The queue's own policy: QC at `s + 8`, QSPEC, QN, then its arguments.
  local qn = tonumber(ARGV[s + 10])
  local queue_args = {}
  for i = 1, qn do
    queue_args[i] = ARGV[s + 10 + i]
  end
  local qspec = ARGV[s + 9]
  s = s + 3 + qn
  -- What the queue keeps of ended jobs: KC KCF KD KDF ('' for no bound).
  local kc, kcf = tonumber(ARGV[s + 8]), tonumber(ARGV[s + 9])
  local kd, kdf = tonumber(ARGV[s + 10]), tonumber(ARGV[s + 11])
  s = s + 4
  local parts = tonumber(ARGV[s + 8]) or 1
  if config and (config.parts or 1) ~= parts then
    return { now, -1, config.parts or 1 }
  end
  local spec = ARGV[o + 4]
  local a = o + 5
  local function list()
    local n = tonumber(ARGV[a])
    local out = {}
    for i = 1, n do
      out[i] = ARGV[a + i]
    end
    a = a + n + 1
    return out
  end
  local default = list()
  local own_policies = tonumber(ARGV[a])
  a = a + 1
  redis.call('DEL', base .. 'policies', base .. 'specs')
  if parts > 1 then
    -- For `read_config`, under a name no group has (a control character).
    redis.call('HSET', base .. 'specs', '\001partitions', ARGV[s + 8])
  end
  if qspec ~= '' then
    redis.call('HSET', base .. 'specs', '\001queue_policy', qspec)
  end
  -- The groups' policies change: none read before now may be kept.
  policy_cache, default_policy, overrides, run_time = {}, nil, nil, nil
  for _ = 1, own_policies do
    local name = ARGV[a]
    redis.call('HSET', base .. 'specs', name, ARGV[a + 1])
    a = a + 2
    redis.call('HSET', base .. 'policies', name, cmsgpack.pack(list()))
  end
  local previous = config
  config = {
    fp = fp, default = default, spec = spec, gc = tonumber(ARGV[a]), ma = tonumber(ARGV[a + 1]),
    lease = tonumber(ARGV[a + 2]), bo = tonumber(ARGV[a + 3]), bo_max = tonumber(ARGV[a + 4]),
    max_jobs = tonumber(ARGV[a + 5]), mp = tonumber(ARGV[a + 6]), qc = tonumber(ARGV[a + 7]),
    qp = qspec ~= '' and queue_args or nil, qspec = qspec ~= '' and qspec or nil,
    parts = parts > 1 and parts or nil, sfx = ARGV[s + 9],
    kc = kc and kc > 0 and kc or nil, kcf = kcf, kd = kd, kdf = kdf,
  }
  redis.call('SET', base .. 'config', cmsgpack.pack(config))
  if previous then
    -- A refusal under the old queue policy says nothing of the new one.
    local stored = redis.call('GET', base .. 'qgate')
    if stored then
      local q = cmsgpack.unpack(stored)
      q.n = 0
      redis.call('SET', base .. 'qgate', cmsgpack.pack(q))
    end
    local names = redis.call('SMEMBERS', base .. 'groups')
    for _, name in ipairs(names) do
      local g = load_group(name)
      if g then
        g.p = nil
        g.next_at = 0
      end
    end
    for _, name in ipairs(names) do
      refresh(name)
    end
  end
  return { now, 1 }
end

-- read_config: the stored configuration: the default spec, GC, MA, LEASE, BO, BO_MAX,
-- MAX_JOBS, MAX_PAYLOAD, then each group's own (name, spec), with the queue's own policy,
-- its concurrency cap and its partitions under names no group has (a control character
-- first); nothing if the queue has none.
-- Reads only.
function ops.read_config()
  if not config then
    return {}
  end
  local out = { config.spec, config.gc, config.ma, config.lease, config.bo, config.bo_max,
    config.max_jobs, config.mp }
  local specs = redis.call('HGETALL', base .. 'specs')
  for i = 1, #specs do
    out[#out + 1] = specs[i]
  end
  if (config.qc or 0) > 0 then
    out[#out + 1] = '\001queue_concurrency'
    out[#out + 1] = int(config.qc)
  end
  if config.kc or config.kd or config.kdf then
    -- KC,KCF,KD,KDF, each '' for none.
    local function opt_int(x)
      return x and int(x) or ''
    end
    out[#out + 1] = '\001keep'
    out[#out + 1] = opt_int(config.kc) .. ',' .. opt_int(config.kcf) .. ',' .. opt_int(config.kd)
      .. ',' .. opt_int(config.kdf)
  end
  return out
end

-- One job of an enqueue: ARGV from `a`: id ('' to generate one), group, payload, delay
-- (µs), max_attempts ('' for the queue's), not-before time ('' for none), deduplication
-- key ('' for none), its time to live (µs) and whether it replaces a waiting job's payload
-- ('1'). Answers status ('created', 'exists', 'dedup', 'full'), id, state, estimated
-- start (for 'full' the most jobs). Rust checked the not-before time (at most 2^53 µs).
-- The most a job of group `name` may cost: what its policy and the queue's own can ever
-- admit a start (nil: any cost, eventually), as Rust's `max_cost`; `queue_policy` the
-- queue's own policy if the caller has read it already.
local function max_cost_of(name, queue_policy)
  local own = policy_of(name).mc
  local queue = config.qp and (queue_policy or read_policy(config.qp)).mc
  if own and queue then
    return min(own, queue)
  end
  return own or queue
end

local function enqueue_one(ARGV, a, out)
  if maintained_at ~= now then
    maintain(now)
  end
  local id, name, payload = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  if id ~= '' then
    local existing = load_job(id)
    if existing then
      out[#out + 1] = 'exists'
      out[#out + 1] = id
      out[#out + 1] = existing.place
      out[#out + 1] = existing.estimated_start
      return
    end
  end
  local dedup_key = ARGV[a + 6]
  if dedup_key ~= '' then
    local raw = redis.call('HGET', base .. 'dedup', dedup_key)
    if raw then
      local expires, estimate = struct.unpack('<dd', raw)
      if expires > now then
        local first = raw:sub(17)
        local state = 'finished'
        local job = load_job(first)
        if job then
          if ARGV[a + 8] == '1' and (job.place == 'waiting' or job.place == 'scheduled') then
            job.payload = payload
          end
          state, estimate = job.place, job.estimated_start
        end
        out[#out + 1] = 'dedup'
        out[#out + 1] = first
        out[#out + 1] = state
        out[#out + 1] = estimate
        return
      end
    end
  end
  if meta.jobs >= config.max_jobs then
    out[#out + 1] = 'full'
    out[#out + 1] = id
    out[#out + 1] = ''
    out[#out + 1] = config.max_jobs
    return
  end
  -- The usual values ('' for none, '0', '1') without `tonumber`, which reads its text twice
  -- with the C library's parser.
  local text = ARGV[a + 5]
  local not_before = text == '' and 0 or tonumber(text) or 0
  text = ARGV[a + 9]
  local priority = (text == '0' or text == '') and 0 or tonumber(text) or 0
  text = ARGV[a + 10]
  local cost = (text == '1' or text == '') and 1 or tonumber(text) or 1
  if cost > 1 then
    local most = max_cost_of(name)
    if most and cost > most then
      out[#out + 1] = 'costly'
      out[#out + 1] = id
      out[#out + 1] = cost
      out[#out + 1] = most
      return
    end
  end
  if id == '' then
    -- Free without a look: a producer's id is never all digits (`check_id`), nor, in a
    -- queue of several partitions, digits, a dot and digits (`Partitioned`), and the
    -- queue's own count only grows. (The Rust core looks anyway, in its map; here a look
    -- would be a GET per job.)
    meta.last_id = meta.last_id + 1
    id = int(meta.last_id) .. (config.sfx or '')
  end
  local max_attempts = ARGV[a + 4] ~= '' and tonumber(ARGV[a + 4]) or config.ma
  -- Held back to the later of the delay's end and the not-before time.
  text = ARGV[a + 3]
  local at = max(now + (text == '0' and 0 or tonumber(text)), not_before)
  -- The record is written here, in the flat layout, without a table: a later operation of
  -- this call that asks for the job reads it from Redis.
  local place, head, rank, estimate, order = PLACE_CODE.waiting, 0, 0, nil, nil
  if at > now then
    order = next_seq()
    add_due('scheduled', at, padded(order) .. id)
    local line = peek_place(name, now, priority, cost)
    place, head, estimate = PLACE_CODE.scheduled, 1, max(at, line)
  else
    estimate, rank = join_tail(name, id, now, priority, cost)
    at = -1
  end
  -- A group paused until resumed has no time to give: the pause's end stands for it.
  if estimate > UNTIL_RESUMED then
    estimate = UNTIL_RESUMED
  end
  meta.totals.enqueued = meta.totals.enqueued + 1
  if watched ~= false then
    emit(EV.enqueued, id, name)
  end
  meta.jobs = meta.jobs + 1
  jobs[id], deleted_jobs[id] = nil, nil
  if dedup_key ~= '' then
    local expires = now + tonumber(ARGV[a + 7])
    redis.call('HSET', base .. 'dedup', dedup_key, struct.pack('<dd', expires, estimate) .. id)
    add_due('dedupx', expires, dedup_key)
  end
  redis.call('SET', base .. 'j:' .. id, job_record(place, head, 0, rank, 0, max_attempts, now,
    estimate, -1, -1, -1, at, order or -1, -1, -1, name, '', '', payload, priority, cost, 0, '',
    ''))
  out[#out + 1] = 'created'
  out[#out + 1] = id
  out[#out + 1] = PLACE_NAME[place]
  out[#out + 1] = estimate
end

-- enqueue N (ID GROUP PAYLOAD DELAY MAX_ATTEMPTS NOT_BEFORE DEDUP_KEY DEDUP_TTL
-- DEDUP_REPLACE PRIORITY COST)*N: answers now, then four values per job.
function ops.enqueue(ARGV, o)
  local out = { now }
  local created = false
  local count = PL.num(ARGV[o + 3]) or tonumber(ARGV[o + 3])
  for i = 0, count - 1 do
    enqueue_one(ARGV, o + 4 + i * 11, out)
    if out[#out - 3] == 'created' then
      created = true
    end
  end
  if created then
    publish()
  end
  return out
end

-- Leases job `id` (nil: none) to `worker` until `expires` with the next fence; answers its
-- payload, its attempts with this one, and the fence, or nil if there is no such job. A
-- record in the flat layout not read yet this call is read and written without a table.
local function start_job(id, worker, expires)
  if not id then
    return nil
  end
  if jobs[id] == nil then
    local key = base .. 'j:' .. id
    local raw = redis.call('GET', key)
    local tag = raw and raw:byte(1)
    if tag == JOB_TAG or tag == JOB_TAG_BEFORE then
      local _, head, has_error, rank, attempts, max_attempts, enqueued_at, estimate, at, order,
        ended, dead_order, group, err, payload, priority, cost, flags, progress, result
      if tag == JOB_TAG then
        _, _, head, has_error, rank, attempts, max_attempts, enqueued_at, estimate, _, _, _, at,
          order, ended, dead_order, group, _, err, payload, priority, cost, flags, progress,
          result = struct.unpack(JOB_LAYOUT, raw)
      else
        _, _, head, has_error, rank, attempts, max_attempts, enqueued_at, estimate, _, _, _, at,
          order, ended, dead_order, group, _, err, payload = struct.unpack(JOB_LAYOUT_BEFORE, raw)
        priority, cost, flags, progress, result = 0, 1, 0, '', ''
      end
      local token = next_seq()
      attempts = attempts + 1
      redis.call('SET', key, job_record(PLACE_CODE.active, head, has_error, rank, attempts,
        max_attempts, enqueued_at, estimate, token, now, expires, at, order, ended, dead_order,
        group, worker, err, payload, priority, cost, flags, progress, result))
      return payload, attempts, token
    end
    read_as['j:' .. id] = raw
    jobs[id] = raw and unpack_job(raw) or false
  end
  local job = load_job(id)
  if not job then
    return nil
  end
  local token = next_seq()
  job.attempts = job.attempts + 1
  job.place, job.token, job.started, job.expires, job.worker =
    'active', token, now, expires, worker
  return job.payload, job.attempts, token
end

-- lease WORKER MAX_JOBS LEASE REQUEST: answers now, then per job: id, group, payload,
-- attempt, token, started, eligible, lease expiry. REQUEST ('' for none) is the caller's id
-- of this call: a repeat of it while its leases last answers what it took (`r:REQUEST`).
-- MAX_JOBS 0 takes nothing and answers only such a repeat's jobs: a queue of several
-- partitions asks each one that way first when a call may be a repeat (`Partitioned`).
function ops.lease(ARGV, o)
  local worker, max_jobs, request = ARGV[o + 3], tonumber(ARGV[o + 4]), ARGV[o + 6]
  local lease = tonumber(ARGV[o + 5])
  maintain(now)
  drops_left = MAINTENANCE_BATCH
  local out = { now }
  local request_key = request ~= '' and (base .. 'r:' .. request) or nil
  if request_key then
    local raw = redis.call('GET', request_key)
    local taken = raw and cmsgpack.unpack(raw)
    if taken and taken[1] > now then
      -- A repeated call: the jobs the first took that its leases still hold, as it
      -- answered them.
      for i = 2, #taken, 3 do
        local id, fence, eligible = taken[i], taken[i + 1], taken[i + 2]
        local job = load_job(id)
        if job and job.place == 'active' and job.token == fence and job.expires > now then
          local n = #out
          out[n + 1], out[n + 2], out[n + 3], out[n + 4] = id, job.group, job.payload, job.attempts
          out[n + 5], out[n + 6], out[n + 7], out[n + 8] = fence, job.started, eligible, job.expires
        end
      end
      return out
    end
  end
  -- The ready sets that may hold a group, most urgent first, and whether any group in
  -- them is eligible now. A set of a priority above 0 found empty is no longer looked at.
  local due = false
  for _, level in ipairs(levels_used()) do
    if first_due(ready_key(level), now) then
      due = true
    elseif level > 0 and redis.call('EXISTS', ready_key(level)) == 0 then
      meta.lv = meta.lv - 2 ^ level
    end
  end
  if not due then
    -- No group is eligible: nothing to take out of a ready set and put back.
    return out
  end
  if queue_opens() > now then
    -- The queue is paused, or its own policy refused a start until then: nothing starts,
    -- nothing is counted.
    return out
  end
  -- The queue's cap: the jobs leased before this call (this call's count below).
  local active = queue_active()
  local queue_policy = config.qp and read_policy(config.qp)
  -- The ready sets are taken in order of priority, each until none of its groups is
  -- eligible: a group's next job only ever gets less urgent within a call, so a group
  -- that goes back goes to the set being taken or a later one (maybe one this call
  -- starts: `meta.lv` is asked as the call goes). From each, the groups come
  -- out as many at once as jobs are still wanted, and those that go back to it (`refresh`)
  -- are added together once the ones taken out are spent. The order is the same as one at
  -- a time: a group put back is scored no earlier than now and ordered after every entry
  -- in the set, so no due entry taken out with it would have come after it. The leases
  -- are added together at the end, all expiring alike.
  ready_adds = {}
  local leased = {}
  local expires = now + lease
  local count = 0
  local stop = false
  for level = 0, 9 do
    if stop or count >= max_jobs or (active and active + count >= config.qc) then
      break
    end
    -- A set of a priority no group's next job has is not looked at.
    if level == 0 or level_used(level) then
      ready_level = level
      local key = ready_key(level)
      local taken, next_taken = {}, 1
      while count < max_jobs and not (active and active + count >= config.qc) do
        if next_taken > #taken then
          add_ready()
          taken, next_taken = redis.call('ZPOPMIN', key, int(max_jobs - count)), 1
        end
        -- The first ready group, taken out of the set (put back as it was if not due yet).
        local member, score = taken[next_taken], taken[next_taken + 1]
        if not member then
          break
        end
        local at = tonumber(score)
        if at > now then
          -- Not due: it goes back with the rest taken out; the groups put back meanwhile may
          -- be due, and are asked for again.
          put_back(taken, next_taken)
          taken, next_taken = {}, 1
          if #ready_adds == 0 then
            break
          end
        else
          next_taken = next_taken + 2
          local name = member:sub(21)
          local policy = policy_of(name)
          local g = load_group(name)
          local id, in_front
          if g then
            id, in_front = next_job(name, g)
          end
          if g and not id and in_front then
            -- MAINTENANCE_BATCH entries of cancelled jobs dropped: the group goes back as it
            -- was, and the next call goes on.
            next_taken = next_taken - 2
            stop = true
            break
          elseif g and not id then
            -- The line is what is waiting: none.
            g.ra, g.ro = nil, nil
            g.n = 0
            refresh(name)
          elseif g then
            g.ra, g.ro = nil, nil
            -- What the next job costs: 1 unless the line holds a job that costs more.
            local cost = 1
            if (g.c or 0) > 0 then
              if id == true then
                local entry = redis.call('LINDEX', base .. 'q:' .. name, '0')
                id = entry and entry:sub(21)
              end
              local job = id and load_job(id)
              cost = job and job.cost or 1
            end
            local limit = cost > 1 and max_cost_of(name, queue_policy)
            if limit and cost > limit then
              -- Its policies can never admit it (changed since it was enqueued): it dies,
              -- costing no attempt and nothing of the group's policy.
              if in_front then
                redis.call('ZREM', base .. 'l:' .. name, id)
                g.f = g.f - 1
              else
                redis.call('LPOP', base .. 'q:' .. name)
              end
              g.n, g.c = g.n - 1, g.c - 1
              if g.p then
                g.p.covers = max(g.p.covers - 1, 0)
              end
              local job = load_job(id)
              job.last_error = too_costly_error(cost)
              meta.totals.dead = meta.totals.dead + 1
              emit(EV.dead, id, name, nil, nil, nil, job.last_error)
              to_dead(id, job)
              refresh(name)
            else
              -- Kept to undo the group's start if the queue's own policy refuses it.
              local before_state, before_alg = g.state, g.alg
              if queue_policy then
                before_state = copy(g.state)
              end
              local allowed, delay, reset_after, state, alg =
                apply(policy, g.state, g.alg, now, cost)
              g.state, g.alg = state, alg
              local queue_refused
              if allowed and queue_policy then
                local q = queue_gate()
                local ok, qdelay, _, qstate, qalg = apply(queue_policy, q.s, q.a, now, cost)
                if ok then
                  q.s, q.a = qstate, qalg
                else
                  queue_refused = qdelay
                end
                gate_changed = true
              end
              if queue_refused then
                -- The queue waits; the group keeps its state and its place (put back with
                -- the entries taken and not reached).
                queue_gate().n = now + micros_up(queue_refused)
                g.state, g.alg = before_state, before_alg
                g.ra, g.ro, g.rl = at, tonumber(member:sub(1, 20)), level
                next_taken = next_taken - 2
                stop = true
                break
              elseif not allowed then
                g.next_at = now + micros_up(delay)
                refresh(name)
              else
                g.idle_at = now + round_micros(reset_after)
                if in_front then
                  redis.call('ZREM', base .. 'l:' .. name, id)
                  g.f = g.f - 1
                else
                  local entry = redis.call('LPOP', base .. 'q:' .. name)
                  if id == true then
                    id = entry and entry:sub(21)
                  end
                end
                g.n = g.n - 1
                if cost > 1 then
                  g.c = g.c - 1
                end
                local payload, attempts, token = start_job(id, worker, expires)
                if not payload then
                  refresh(name)
                else
                  g.active = g.active + 1
                  if g.p then
                    g.p.covers = max(g.p.covers - 1, 0)
                  end
                  leased[#leased + 1] = padded(token) .. id
                  meta.totals.started = meta.totals.started + 1
                  emit(EV.started, id, name, attempts, nil, worker)
                  count = count + 1
                  local n = #out
                  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = id, name, payload, attempts
                  out[n + 5], out[n + 6], out[n + 7], out[n + 8] = token, now, at, expires
                  refresh(name)
                end
              end
            end
          end
        end
      end
      -- The groups taken out and not reached go back as they were.
      put_back(taken, next_taken)
      add_ready()
    end
  end
  ready_adds = nil
  ready_level = 0
  if gate_changed then
    redis.call('SET', base .. 'qgate', cmsgpack.pack(gate))
    gate_changed = false
  end
  if #leased > 0 then
    local args, score = {}, int(expires)
    for k = 1, #leased do
      args[2 * k - 1], args[2 * k] = score, leased[k]
    end
    redis.call('ZADD', base .. 'leases', unpack(args))
    if meta.due and expires < meta.due then
      meta.due = expires
    end
  end
  if request_key and count > 0 then
    -- What this call took, for a repeat of it while its leases last: the lease's end,
    -- then id, fence and eligible time per job. Kept in Redis a second past the lease (by
    -- Redis's clock), and read only while the queue's clock is before the lease's end.
    local taken = { now + lease }
    for i = 2, #out, 8 do
      local n = #taken
      taken[n + 1], taken[n + 2], taken[n + 3] = out[i], out[i + 4], out[i + 6]
    end
    redis.call('SET', request_key, cmsgpack.pack(taken), 'PX', int(floor(lease / 1000) + 1000))
  end
  return out
end

-- Whether a job's end frees a slot a waiting lease may take: the queue caps leased jobs
-- per group or in all (`QueueConfig::caps_leases`).
local function caps_slots()
  return config.gc > 0 or (config.qc or 0) > 0
end

-- Whether `id` is leased with `token` (its text) and the lease is live; an expired one is
-- handled on the spot.
local function held(id, token)
  local job = load_job(id)
  if not job or job.place ~= 'active' or int(job.token) ~= token then
    return false
  end
  if job.expires <= now then
    lease_expired(id)
    return false
  end
  return true
end


-- ack ID TOKEN [RESULT]: answers now, then 'ok', 'lost', or 'gone' (no such job, or one
-- completed). RESULT is kept with the job while it stays readable as completed.
function ops.ack(ARGV, o, last)
  local id, token = ARGV[o + 3], ARGV[o + 4]
  -- The result, if the call sends one (in a `multi`, the next operation's follow).
  local result = last >= o + 5 and ARGV[o + 5] or nil
  maintain(now)
  if jobs[id] == nil then
    -- Read without a table: the record's head says whether this lease holds the job, and
    -- what the ack needs. Anything else (no such job, a lease lost or expired, a record
    -- written before) takes the path below, from the same record.
    local raw = redis.call('GET', base .. 'j:' .. id)
    read_as['j:' .. id] = raw
    local tag = raw and raw:byte(1)
    if (tag == JOB_TAG or tag == JOB_TAG_BEFORE) and (config.kc or 0) == 0 then
      local _, place, _, _, _, _, _, _, _, fence, _, expires, _, _, _, _, group =
        struct.unpack(JOB_HEAD, raw)
      -- The fence as the Rust side sends it: its decimal digits, as `int` prints them.
      if place == 3 and expires > now and fence == tonumber(token) then
        redis.call('ZREM', base .. 'leases', padded(fence) .. id)
        local g = load_group(group)
        if g then
          g.active = max(g.active - 1, 0)
        end
        remove_job(id)
        meta.totals.acked = meta.totals.acked + 1
        emit(EV.acked, id, group)
        refresh(group)
        if caps_slots() then
          publish()
        end
        return { now, 'ok' }
      end
    end
    jobs[id] = raw and unpack_job(raw) or false
  end
  local found = load_job(id)
  if not found or found.place == 'completed' then
    -- A completed job has left the queue as far as its workers go.
    return { now, 'gone' }
  end
  if not held(id, token) then
    return { now, 'lost' }
  end
  local name = release(id)
  if name then
    complete(id, load_job(id), result)
    meta.totals.acked = meta.totals.acked + 1
    emit(EV.acked, id, name)
    refresh(name)
  end
  if caps_slots() then
    publish()
  end
  return { now, 'ok' }
end

-- The backoff before the retry of the job's latest attempt, in µs.
local function backoff_for(job, jitter)
  local attempts = max(job.attempts, 1)
  local full = min(config.bo * 2 ^ min(attempts - 1, 60), config.bo_max)
  if jitter ~= jitter then
    jitter = 0
  end
  jitter = min(max(jitter, 0), 1)
  local x = full * (0.5 + 0.5 * jitter)
  -- Rust's `f64::round`: halves away from zero (x is positive).
  local r = floor(x)
  if x - r >= 0.5 then
    r = r + 1
  end
  return max(r, 1)
end

-- fail ID TOKEN KIND ERROR_FLAG ERROR AFTER PAUSE JITTER: KIND 'fatal', 'retry', 'pause' or
-- 'release'; ERROR_FLAG 1 if ERROR is given; AFTER the retry's delay in µs ('' for the
-- backoff); PAUSE the pause in µs, rounded up. Answers now, then the outcome ('lost',
-- 'gone', 'repeated', 'dead', 'retrying', 'paused', 'released') and its time (0 for none).
function ops.fail(ARGV, o)
  local id, kind = ARGV[o + 3], ARGV[o + 5]
  local error = ARGV[o + 6] == '1' and ARGV[o + 7] or nil
  maintain(now)
  local found = load_job(id)
  if not found then
    return { now, 'gone', 0 }
  end
  if found.place ~= 'active' and found.ended and int(found.ended) == ARGV[o + 4] then
    -- A repeat of this lease's failure report, whose answer was lost.
    return { now, 'repeated', 0 }
  end
  if not held(id, ARGV[o + 4]) then
    return { now, 'lost', 0 }
  end
  local name = release(id)
  if not name then
    return { now, 'lost', 0 }
  end
  local job = load_job(id)
  job.ended = job.token
  local backoff = backoff_for(job, tonumber(ARGV[o + 10]))
  local outcome, at = nil, 0
  if kind == 'fatal' then
    job.last_error = error
    outcome = 'dead'
  elseif kind == 'retry' then
    job.last_error = error
    if job.attempts >= job.max_attempts then
      outcome = 'dead'
    else
      outcome = 'retrying'
      at = now + (ARGV[o + 8] ~= '' and tonumber(ARGV[o + 8]) or backoff)
    end
  elseif kind == 'pause' then
    job.last_error = error
    job.attempts = max(job.attempts - 1, 0)
    outcome = 'paused'
    at = now + tonumber(ARGV[o + 9])
  else
    job.attempts = max(job.attempts - 1, 0)
    outcome = 'released'
  end
  local totals = meta.totals
  -- A pause is the upstream's refusal, not the job's failure; a release is neither.
  if outcome == 'dead' or outcome == 'retrying' then
    totals.failed = totals.failed + 1
  end
  if outcome == 'retrying' then
    totals.retried = totals.retried + 1
  elseif outcome == 'paused' then
    totals.pauses = totals.pauses + 1
  end
  if outcome == 'dead' or outcome == 'retrying' then
    emit(EV.failed, id, name, job.attempts, nil, nil, job.last_error)
    if outcome == 'dead' then
      emit(EV.dead, id, name, nil, nil, nil, job.last_error)
    else
      emit(EV.retried, id, name, nil, at)
    end
  end
  if outcome == 'dead' then
    totals.dead = totals.dead + 1
    to_waiting(job)
    to_dead(id, job)
    refresh(name)
  elseif outcome == 'retrying' then
    local order = next_seq()
    to_waiting(job)
    job.place, job.at, job.order, job.head = 'scheduled', at, order, true
    add_due('scheduled', at, padded(order) .. id)
    refresh(name)
    if at <= now then
      maintained_at = nil
      maintain(now)
    end
  elseif outcome == 'paused' then
    to_waiting(job)
    local g = group_entry(name)
    g.paused_until = max(g.paused_until, at)
    -- The group's pause as it ends up: a longer one already set stands.
    emit(EV.paused, id, name, nil, g.paused_until)
    if g.p then
      g.p.last = max(g.p.last, g.paused_until)
    end
    join_head(name, id)
  else
    to_waiting(job)
    join_head(name, id)
  end
  publish()
  return { now, outcome, at }
end

-- progress ID TOKEN DATA: records a running job's progress report. Answers now, then 'ok',
-- 'lost', or 'gone' (no such job).
function ops.progress(ARGV, o)
  local id = ARGV[o + 3]
  maintain(now)
  if not load_job(id) then
    return { now, 'gone' }
  end
  if not held(id, ARGV[o + 4]) then
    return { now, 'lost' }
  end
  load_job(id).progress = ARGV[o + 5]
  return { now, 'ok' }
end

-- extend ID TOKEN LEASE: answers now, then 'ok' and the new expiry, or 'lost' and 0.
function ops.extend(ARGV, o)
  local id = ARGV[o + 3]
  local before = next_event()
  maintain(now)
  if not held(id, ARGV[o + 4]) then
    return { now, 'lost', 0 }
  end
  local job = load_job(id)
  redis.call('ZREM', base .. 'leases', padded(job.token) .. id)
  job.expires = now + tonumber(ARGV[o + 5])
  add_due('leases', job.expires, padded(job.token) .. id)
  local after = next_event()
  if after ~= -1 and (before == -1 or after < before) then
    -- A lease made shorter may expire before what waiting calls sleep until.
    publish()
  end
  return { now, 'ok', job.expires }
end

-- cancel ID: answers now, then 'ok', 'unknown' or 'active'.
function ops.cancel(ARGV, o)
  local id = ARGV[o + 3]
  maintain(now)
  local job = load_job(id)
  if not job then
    return { now, 'unknown' }
  end
  if job.place == 'active' then
    return { now, 'active' }
  elseif job.place == 'completed' then
    redis.call('ZREM', base .. 'done', padded(job.order) .. id)
    drop_completed(id)
    return { now, 'ok' }
  elseif job.place == 'scheduled' then
    redis.call('ZREM', base .. 'scheduled', padded(job.order) .. id)
  elseif job.place == 'dead' then
    unbury(id, job)
  else
    local g = load_group(job.group)
    if g and front_of(job.group, g) > 0
      and redis.call('ZREM', base .. 'l:' .. job.group, id) == 1 then
      g.f = g.f - 1
    elseif g then
      -- In the list, its entry stays until it reaches the head (see `next_job`): finding
      -- it now would scan the list.
      g.x = (g.x or 0) + 1
    end
    if g and (job.cost or 1) > 1 and (g.c or 0) > 0 then
      g.c = g.c - 1
    end
    if g and g.n > 0 then
      local before = g.n
      g.n = g.n - 1
      -- One job fewer ahead: the projection is kept (now slightly pessimistic).
      if g.p and g.p.covers == before then
        g.p.covers = g.p.covers - 1
      end
    end
  end
  remove_job(id)
  refresh(job.group)
  return { now, 'ok' }
end

-- job ID: answers the job (see `job_reply`), or nothing. Reads only.
function ops.job(ARGV, o)
  local id = ARGV[o + 3]
  local job = load_job(id)
  local out = {}
  if job then
    job_reply(id, job, out)
  end
  return out
end

-- The counts by state and the totals.
local function counts(out)
  -- Below +inf: all but `KEEP`.
  local scheduled = redis.call('ZCOUNT', base .. 'scheduled', '-inf', '(inf')
  local active = redis.call('ZCOUNT', base .. 'leases', '-inf', '(inf')
  local dead = redis.call('ZCARD', base .. 'dead')
  local completed = redis.call('ZCARD', base .. 'done')
  local t = meta.totals
  local values = { now, scheduled, max(meta.jobs - scheduled - active - dead, 0), active, dead,
    completed, t.enqueued, t.started, t.acked, t.failed, t.retried, t.dead, t.lease_expiries, t.pauses }
  local paused = queue_paused()
  values[#values + 1] = paused > now and paused or -1
  for i = 1, #values do
    out[#out + 1] = values[i]
  end
  return out
end

-- counts: answers now, scheduled, waiting, active, dead, completed, then the totals (enqueued,
-- started, acked, failed, retried, dead, lease expiries, pauses), then when the queue's
-- pause ends (-1: not paused).
function ops.counts()
  maintain(now)
  return counts({})
end

-- stats: as `counts`, then per group with a job waiting or active or that is paused: name,
-- waiting, active, next eligible time (-1: none), when its pause ends (-1: not paused).
-- Unsorted.
function ops.stats()
  maintain(now)
  local out = counts({})
  for _, name in ipairs(redis.call('SMEMBERS', base .. 'groups')) do
    local g = load_group(name)
    if g and (g.n > 0 or g.active > 0 or g.paused_until > now) then
      out[#out + 1] = name
      out[#out + 1] = g.n
      out[#out + 1] = g.active
      out[#out + 1] = g.ra or -1
      out[#out + 1] = g.paused_until > now and g.paused_until or -1
    end
  end
  return out
end

-- Takes group `name` out of `ready` and `retiring` and puts it back as its state now
-- says: its pause changed, so its times did.
local function place_again(name)
  local g = load_group(name)
  if not g then
    return
  end
  if g.ra then
    redis.call('ZREM', ready_key(g.rl or 0), padded(g.ro) .. name)
    g.ra, g.ro = nil, nil
  end
  if g.rt then
    redis.call('ZREM', base .. 'retiring', name)
    g.rt = nil
  end
  -- The line's estimates start from the pause's end.
  g.p = nil
  refresh(name)
end

-- pause GROUP LENGTH: pauses the group ('': the whole queue) for LENGTH µs ('': until
-- resumed), never shortening a pause in place (`QueueCore::pause`). Answers now, then
-- when the pause ends.
function ops.pause(ARGV, o)
  local name, length = ARGV[o + 3], tonumber(ARGV[o + 4])
  maintain(now)
  local ends = length and min(now + length, UNTIL_RESUMED) or UNTIL_RESUMED
  if name == '' then
    ends = max(queue_paused(), ends)
    redis.call('SET', base .. 'paused', int(ends))
    emit(EV.paused, nil, nil, nil, ends)
    return { now, ends }
  end
  local g = group_entry(name)
  g.paused_until = max(g.paused_until, ends)
  place_again(name)
  emit(EV.paused, nil, name, nil, g.paused_until)
  return { now, g.paused_until }
end

-- set_policy GROUP SPEC N ARGS...: sets the group's policy (SPEC '': back to the
-- configuration's), as `QueueCore::set_policy`: the group's refusal under the old one no
-- longer holds it. Answers now.
function ops.set_policy(ARGV, o)
  local name, spec = ARGV[o + 3], ARGV[o + 4]
  maintain(now)
  if spec == '' then
    redis.call('HDEL', base .. 'rpolicies', name)
    redis.call('HDEL', base .. 'rspecs', name)
  else
    local args = {}
    for i = 1, tonumber(ARGV[o + 5]) do
      args[i] = ARGV[o + 5 + i]
    end
    redis.call('HSET', base .. 'rpolicies', name, cmsgpack.pack(args))
    redis.call('HSET', base .. 'rspecs', name, spec)
  end
  -- Asked again by the next look, this call's included.
  policy_cache[name], overrides, run_time = nil, nil, nil
  local g = load_group(name)
  if g then
    g.next_at = 0
  end
  place_again(name)
  -- The group may start sooner under its new policy.
  publish()
  return { now }
end

-- policy GROUP: the group's policy's spec and where it comes from ('run_time', 'config' or
-- 'default'). Reads only.
function ops.policy(ARGV, o)
  local name = ARGV[o + 3]
  local spec = redis.call('HGET', base .. 'rspecs', name)
  if spec then
    return { spec, 'run_time' }
  end
  spec = redis.call('HGET', base .. 'specs', name)
  if spec then
    return { spec, 'config' }
  end
  return { config.spec, 'default' }
end

-- put_schedule NAME CRON TZ GROUP PAYLOAD NEXT: keeps the schedule, firing next at NEXT,
-- unless the same schedule is kept already, which keeps its next tick
-- (`QueueCore::put_schedule`). Answers now, then its next tick.
function ops.put_schedule(ARGV, o)
  local name = ARGV[o + 3]
  maintain(now)
  local s = { c = ARGV[o + 4], z = ARGV[o + 5], g = ARGV[o + 6], p = ARGV[o + 7],
    n = tonumber(ARGV[o + 8]) }
  local raw = redis.call('HGET', base .. 'sched', name)
  if raw then
    local kept = cmsgpack.unpack(raw)
    if kept.c == s.c and kept.z == s.z and kept.g == s.g and kept.p == s.p then
      s.n = kept.n
    end
  end
  redis.call('HSET', base .. 'sched', name, cmsgpack.pack(s))
  return { now, s.n }
end

-- schedules: each schedule: name, cron, time zone, group, payload, next tick. Reads only.
function ops.schedules()
  local out = {}
  local all = redis.call('HGETALL', base .. 'sched')
  for i = 1, #all, 2 do
    local s = cmsgpack.unpack(all[i + 1])
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = all[i], s.c, s.z, s.g
    out[n + 5], out[n + 6] = s.p, s.n
  end
  return out
end

-- delete_schedule NAME: answers now, then 1 if there was one, else 0.
function ops.delete_schedule(ARGV, o)
  maintain(now)
  return { now, redis.call('HDEL', base .. 'sched', ARGV[o + 3]) }
end

-- fire NAME DUE NEXT: enqueues the schedule's job for its tick DUE and moves it on to NEXT,
-- if DUE is still its next tick and has come (`QueueCore::fire_schedule`). Answers now,
-- then 'none', or the enqueue's four values (`enqueue_one`).
function ops.fire(ARGV, o)
  local name, due, next = ARGV[o + 3], tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5])
  local raw = redis.call('HGET', base .. 'sched', name)
  local s = raw and cmsgpack.unpack(raw)
  if not s or s.n ~= due or due > now then
    return { now, 'none' }
  end
  if #s.p > config.mp then
    -- Put when the queue took larger payloads: refused as an enqueue of it would be.
    return { now, 'big', #s.p, config.mp }
  end
  local out = { now }
  enqueue_one({ '', s.g, s.p, '0', '', '', '', '', '', '0', '1' }, 1, out)
  if out[2] == 'created' then
    s.n = max(next, now + 1)
    redis.call('HSET', base .. 'sched', name, cmsgpack.pack(s))
    publish()
  end
  return out
end

-- resume GROUP: ends every pause of the group ('': the queue's own). Answers now.
function ops.resume(ARGV, o)
  local name = ARGV[o + 3]
  maintain(now)
  if name == '' then
    redis.call('DEL', base .. 'paused')
  else
    local g = load_group(name)
    if g then
      g.paused_until = 0
      place_again(name)
    end
  end
  publish()
  return { now }
end

-- groups: how many groups the queue holds state for. Reads only.
function ops.groups()
  return redis.call('SCARD', base .. 'groups')
end

-- jobs STATE GROUP OFFSET LIMIT: the jobs in STATE ('scheduled', 'waiting', 'active' or
-- 'dead') after the first OFFSET, at most LIMIT, each as `job_reply`, in the order
-- `QueueCore::jobs` gives: waiting ones by group name (GROUP's only, unless '') then their
-- place in line. Reads only.
function ops.jobs(ARGV, o)
  local state, group = ARGV[o + 3], ARGV[o + 4]
  local offset, limit = tonumber(ARGV[o + 5]), tonumber(ARGV[o + 6])
  local out = {}
  -- Positions beyond 2^53 hold nothing (a queue holds fewer jobs).
  local last = 2 ^ 53
  if limit <= 0 or offset >= last then
    return out
  end
  local ids = {}
  if state == 'waiting' then
    local names = { group }
    if group == '' then
      names = redis.call('SMEMBERS', base .. 'groups')
      table.sort(names)
    end
    local skip = offset
    for _, name in ipairs(names) do
      if #ids >= limit then
        break
      end
      local g = load_group(name)
      if g and g.n > 0 then
        if skip >= g.n then
          skip = skip - g.n
        else
          for i, id in ipairs(line_ids(name, g, skip + limit - #ids)) do
            if i > skip then
              ids[#ids + 1] = id
            end
          end
          skip = 0
        end
      end
    end
  else
    -- Scheduled jobs' and leases' members are 20 digits then the id; `KEEP`, scored +inf,
    -- is last and no job.
    local key = ({ scheduled = 'scheduled', active = 'leases', dead = 'dead', completed = 'done' })[
      state]
    if key then
      local stop = min(offset + limit - 1, last)
      for _, member in ipairs(redis.call('ZRANGE', base .. key, int(offset), int(stop))) do
        if member ~= KEEP then
          ids[#ids + 1] = key == 'dead' and member or member:sub(21)
        end
      end
    end
  end
  for _, id in ipairs(ids) do
    local job = load_job(id)
    if job then
      job_reply(id, job, out)
    end
  end
  return out
end

-- retry_dead ALL IDS...: ALL 1 for the first MAINTENANCE_BATCH dead jobs (the caller calls
-- again while some are left), else the ids given. Answers now, how many went back in line,
-- and how many dead jobs are left.
function ops.retry_dead(ARGV, o, last)
  maintain(now)
  local chosen = {}
  if ARGV[o + 3] == '1' then
    chosen = redis.call('ZRANGE', base .. 'dead', 0, MAINTENANCE_BATCH - 1)
  else
    for i = o + 4, last do
      local job = load_job(ARGV[i])
      if job and job.place == 'dead' then
        chosen[#chosen + 1] = ARGV[i]
      end
    end
  end
  local n = 0
  for _, id in ipairs(chosen) do
    local job = load_job(id)
    if job and unbury(id, job) then
      job.attempts = 0
      to_waiting(job)
      job.dead_order = nil
      local estimate, rank = join_tail(job.group, id, now, job.priority or 0, job.cost or 1)
      job.estimated_start, job.rank = estimate, rank
      emit(EV.retried, id, job.group, nil, now)
      n = n + 1
    end
  end
  if n > 0 then
    publish()
  end
  return { now, n, redis.call('ZCARD', base .. 'dead') }
end

-- purge_dead: the queue's upkeep (a job whose last lease ran out dies there), then removes
-- the first MAINTENANCE_BATCH dead jobs (the caller calls again while some are left);
-- answers how many, and how many are left.
function ops.purge_dead()
  maintain(now)
  local ids = redis.call('ZRANGE', base .. 'dead', 0, MAINTENANCE_BATCH - 1)
  for _, id in ipairs(ids) do
    local job = config.kdf and load_job(id)
    if job then
      forget_dead(id, job)
    else
      remove_job(id)
      redis.call('ZREM', base .. 'dead', id)
    end
  end
  return { #ids, redis.call('ZCARD', base .. 'dead') }
end

-- next_event: the earliest time a group becomes eligible, a scheduled job is due or a
-- lease expires (-1: none). Reads only.
function ops.next_event()
  return next_event()
end

-- The operations that tick the queue's clock (the others read it as it is), and those
-- that write (the others read only).
local ticking = {
  enqueue = true, lease = true, ack = true, fail = true, extend = true, cancel = true,
  counts = true, stats = true, retry_dead = true, purge_dead = true, pause = true,
  resume = true, set_policy = true, put_schedule = true, delete_schedule = true, fire = true,
  progress = true,
}
local writing = {
  config = true, enqueue = true, lease = true, ack = true, fail = true, extend = true,
  cancel = true, counts = true, stats = true, retry_dead = true, purge_dead = true,
  pause = true, resume = true, set_policy = true, put_schedule = true, delete_schedule = true,
  fire = true, progress = true,
}

-- watch MS: a listener of the queue's events says it listens for MS more ms (see
-- `events_out`). Answers now and the count of event messages so far.
function ops.watch(ARGV, o)
  redis.call('SET', base .. 'watch', '1', 'PX', tonumber(ARGV[o + 3]))
  return { now, tonumber(redis.call('GET', base .. 'evcount')) or 0 }
end

-- multi COUNT (OP N ARGS...)...: the operations in order, as if each were its own call at
-- the same time (each one's maintenance, ticks and answers as alone), written once.
-- Answers each operation's answer, in order. Only ticking operations may be in it.
function ops.multi(ARGV)
  local out = {}
  local a = 4
  for i = 1, PL.num(ARGV[3]) or tonumber(ARGV[3]) do
    local name, n = ARGV[a], PL.num(ARGV[a + 1])
    -- The operation's arguments are read where they are: its first at `ARGV[a + 2]`,
    -- where an operation called alone finds it at `ARGV[3]`.
    out[i] = ops[name](ARGV, a - 1, a + 1 + n)
    a = a + 2 + n
  end
  return out
end

local function queue_call(KEYS, ARGV)
  local name = ARGV[1]
  local op = ops[name]
  if not op then
    return redis.error_reply('paceline: unknown queue operation ' .. tostring(name))
  end
  if name == 'multi' then
    -- Checked before anything is written, as every error reply.
    local a = 4
    -- `PL.num`: the counts repeat from call to call, and `tonumber` reads its text twice.
    for _ = 1, PL.num(ARGV[3]) or tonumber(ARGV[3]) or 0 do
      local n = ticking[ARGV[a]] and (PL.num(ARGV[a + 1]) or tonumber(ARGV[a + 1]))
      if not n then
        return redis.error_reply('paceline: multi holds ticking operations only')
      end
      a = a + 2 + n
    end
  end
  local t = begin(KEYS, ARGV[2])
  if not config and name ~= 'config' and name ~= 'read_config' then
    -- A code of its own: the Rust side sends the configuration it holds, then calls again.
    return redis.error_reply('PACELINE_UNCONFIGURED the queue has no configuration')
  end
  if config and config.parts and name ~= 'config' and name ~= 'read_config'
    and base:find('{q:[%w%-_%.]+}:$') then
    -- The base of a queue of several partitions (its tag the queue's name alone; a
    -- partition's adds `/INDEX~K`) holds only their number: a handle that opened the
    -- queue as one partition (before it was made anew with several) must not go on
    -- keeping jobs here, where no partition looks.
    return redis.error_reply('PACELINE_PARTITIONED this queue keeps its jobs in '
      .. int(config.parts) .. ' partitions: open it again with partitions = '
      .. int(config.parts))
  end
  maintained_at, wake = nil, false
  events_out, watched = {}, nil
  if ticking[name] or name == 'multi' then
    tick(t)
  else
    now = meta.now
  end
  local answer = op(ARGV, 0, #ARGV)
  if writing[name] or name == 'multi' then
    flush()
  end
  if wake then
    redis.call('PUBLISH', base .. 'changed', '')
  end
  if #events_out > 0 then
    local n = redis.call('INCR', base .. 'evcount')
    redis.call('PUBLISH', base .. 'events', struct.pack('<d', n) .. table.concat(events_out))
  end
  return answer
end
