-- paceline's job queue in Redis, reduced to a floor (run by scripts/queue-floors, never
-- loaded by paceline): the commands a job needs in a layout where a waiting job lives only
-- in its group's list and an active one in one hash field (`act`), its id mapped to its
-- group in another (`idx`), with none of the queue's rules (no policy, no projection, no
-- maintenance, no checks beyond the fence). What it costs the server is a lower bound for
-- any queue in Redis's Lua that keeps that layout. Speaks `enqueue`, `lease`, `ack` and
-- `multi` with the queue's own arguments, so that scripts/queue-instructions can run it
-- (it ends with `queue_call`, which the registration names).
local int, padded = PL.int, PL.padded
local base, meta
local G = '<BddddddddddddddBB'
local groups
local function begin(KEYS, clock_arg)
  PL.clock(clock_arg)
  base = KEYS[1]
  groups = {}
  local raw = redis.call('GET', base .. 'meta')
  meta = raw and { struct.unpack('<Bdddddddddddddd', raw) } or { 110, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
end
local function group(name)
  local g = groups[name]
  if not g then
    local raw = redis.call('GET', base .. 'g:' .. name)
    if raw then
      g = { struct.unpack(G, raw) }
    else
      g = { 71, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
    end
    groups[name] = g
  end
  return g
end
local function flush()
  local w = { base .. 'meta', struct.pack('<Bdddddddddddddd', unpack(meta, 1, 15)) }
  for name, g in pairs(groups) do
    w[#w + 1] = base .. 'g:' .. name
    w[#w + 1] = struct.pack(G, unpack(g, 1, 17))
  end
  redis.call('MSET', unpack(w))
end
local ops = {}
function ops.config() return { 0, 1 } end
function ops.enqueue(ARGV, o)
  local out = { 0 }
  for i = 0, tonumber(ARGV[o + 3]) - 1 do
    local a = o + 4 + i * 6
    local name = ARGV[a + 1]
    meta[3] = meta[3] + 1
    local id = int(meta[3])
    local g = group(name)
    g[2] = g[2] + 1
    redis.call('RPUSH', base .. 'q:' .. name, id .. '\0' .. ARGV[a + 2])
    redis.call('HSET', base .. 'idx', id, name)
    if g[2] == 1 then
      meta[2] = meta[2] + 1
      redis.call('ZADD', base .. 'ready', '0', padded(meta[2]) .. name)
    end
    out[#out + 1] = 'created'; out[#out + 1] = id; out[#out + 1] = 'waiting'; out[#out + 1] = 0
  end
  return out
end
function ops.lease(ARGV, o)
  local max_jobs = tonumber(ARGV[o + 4])
  local out = { 0 }
  local taken = redis.call('ZPOPMIN', base .. 'ready', max_jobs)
  local act, lz, back = {}, {}, {}
  for k = 1, #taken, 2 do
    local name = taken[k]:sub(21)
    local g = group(name)
    local entry = redis.call('LPOP', base .. 'q:' .. name)
    local cut = entry:find('\0', 1, true)
    local id = entry:sub(1, cut - 1)
    meta[2] = meta[2] + 1
    local token = meta[2]
    g[2] = g[2] - 1
    g[3] = g[3] + 1
    act[#act + 1] = id
    act[#act + 1] = struct.pack('<dd', token, 1) .. entry
    lz[#lz + 1] = '99999999999'
    lz[#lz + 1] = padded(token) .. id
    if g[2] > 0 then
      back[#back + 1] = '0'
      back[#back + 1] = padded(token) .. name
    end
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = id, name, entry:sub(cut + 1), 1
    out[n + 5], out[n + 6], out[n + 7], out[n + 8] = token, 0, 0, 0
  end
  if #act > 0 then
    redis.call('HSET', base .. 'act', unpack(act))
    redis.call('ZADD', base .. 'leases', unpack(lz))
  end
  if #back > 0 then
    redis.call('ZADD', base .. 'ready', unpack(back))
  end
  return out
end
function ops.ack(ARGV, o)
  local id, token = ARGV[o + 3], ARGV[o + 4]
  local raw = redis.call('HGET', base .. 'act', id)
  local fence = struct.unpack('<d', raw)
  if fence ~= tonumber(token) then return { 0, 'lost' } end
  local name = redis.call('HGET', base .. 'idx', id)
  redis.call('HDEL', base .. 'act', id)
  redis.call('HDEL', base .. 'idx', id)
  redis.call('ZREM', base .. 'leases', padded(fence) .. id)
  local g = group(name)
  g[3] = g[3] - 1
  return { 0, 'ok' }
end
function ops.multi(ARGV)
  local out = {}
  local a = 4
  for i = 1, tonumber(ARGV[3]) do
    local name, n = ARGV[a], tonumber(ARGV[a + 1])
    out[i] = ops[name](ARGV, a - 1, a + 1 + n)
    a = a + 2 + n
  end
  return out
end
local function queue_call(KEYS, ARGV)
  begin(KEYS, ARGV[2])
  local answer = ops[ARGV[1]](ARGV, 0, #ARGV)
  flush()
  return answer
end
