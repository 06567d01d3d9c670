-- paceline's policies managed at run time, kept in Redis for every instance of the service
-- (`src/runtime_policies/redis.rs` calls it; the service's memory store keeps the same
-- table in its process).
--
-- KEYS[1] is the table's base, `PREFIX{policies}:` (never a key itself): both keys share
-- one hash tag and one cluster slot.
--
--   map        hash: policy name -> its entry, JSON {"spec", "shadow"} as the service
--              wrote it (the service reads it back; this library never looks inside)
--   version    a number raised by each change, which every instance polls
--
-- ARGV[1] is the operation:
--
--   put NAME ENTRY MAX   sets NAME to ENTRY, unless NAME is new and the table holds MAX
--                        entries already: then the error PACELINE_POLICIES_FULL and no
--                        change. Answers { version, previous entry or '' }.
--   delete NAME          removes NAME. Answers { version, the entry removed or '' }; the
--                        version is raised only when something was removed.
--   read KNOWN           answers { version } when the version is KNOWN, else { version,
--                        name, entry, name, entry, ... }: the whole table.
--
-- Every change is one atomic step: the table and its version never disagree.

local function policies_call(keys, argv)
  local map = keys[1] .. 'map'
  local version = keys[1] .. 'version'
  local op = argv[1]
  if op == 'put' then
    local previous = redis.call('HGET', map, argv[2])
    if not previous and redis.call('HLEN', map) >= tonumber(argv[4]) then
      return redis.error_reply('PACELINE_POLICIES_FULL the table holds ' .. argv[4] .. ' policies')
    end
    redis.call('HSET', map, argv[2], argv[3])
    return { redis.call('INCR', version), previous or '' }
  elseif op == 'delete' then
    local previous = redis.call('HGET', map, argv[2])
    if not previous then
      return { tonumber(redis.call('GET', version) or '0'), '' }
    end
    redis.call('HDEL', map, argv[2])
    return { redis.call('INCR', version), previous }
  elseif op == 'read' then
    local now = tonumber(redis.call('GET', version) or '0')
    if tostring(now) == argv[2] then
      return { now }
    end
    local out = { now }
    local all = redis.call('HGETALL', map)
    for i = 1, #all do
      out[i + 1] = all[i]
    end
    return out
  end
  return redis.error_reply('PACELINE_BAD_OP unknown operation ' .. tostring(op))
end
