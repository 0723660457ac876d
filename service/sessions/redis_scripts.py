"""The Lua scripts of the external session store, and what each one's arguments are.

``rlserve.service.sessions.redis_client.RedisSessions`` registers and sends them;
``rlserve.service.sessions.redis_store.CachedSessionStore`` builds their arguments. Kept
apart from both so the rule they share (when a request's sessions are current) reads in
one place.
"""

from __future__ import annotations

# Both scripts take their small per-session values packed into one argument each
# (fixed-width fields read with string.sub and struct.unpack) rather than one argument per
# value: the client's cost of a command grows with its argument count. The records of a
# commit stay one argument each (cutting them out of one long string costs the script more).

# What both scripts must agree on: a group of keys (one request's sessions, KEYS[first]
# to KEYS[last]) is current when every key holds the 8-byte revision ``expected`` has for
# it (its record's first 8 bytes), or no record at all where ``absent`` marks it "1" (a
# session new to the store; nil: none is). As a shared function it costs Redis ~4 us more
# per validate of 64 one-session requests than the rule written into each script (94-96
# against 89-94 us); one copy of the rule is worth that.
_CURRENT_LUA = """
local function current(first, last, expected, absent)
  for i = first, last do
    local want = ''
    if absent == nil or string.byte(absent, i) == 48 then
      want = string.sub(expected, 8 * i - 7, 8 * i)
    end
    if redis.call('GETRANGE', KEYS[i], 0, 7) ~= want then
      return false
    end
  end
  return true
end
"""

# KEYS: the batch's session keys, grouped by request. ARGV[1]: the TTL in ms; ARGV[2]: each
# group's size (u32 LE); ARGV[3]: per key the 8-byte revision it must hold; ARGV[4]: per key
# "1" when it must hold no record yet (a session new to the store), else "0"; ARGV[4 + i]:
# the new record of KEYS[i]. A group (one request's sessions) is written only when every
# key of it matches. Returns the (1-based) numbers of the groups that were not written.
COMMIT_LUA = _CURRENT_LUA + """
local ttl, sizes, expected, absent = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lost = {}
local last = 0
for g = 1, #sizes / 4 do
  local first = last + 1
  last = last + struct.unpack('<I4', sizes, 4 * g - 3)
  if current(first, last, expected, absent) then
    for i = first, last do
      redis.call('SET', KEYS[i], ARGV[4 + i], 'PX', ttl)
    end
  else
    lost[#lost + 1] = g
  end
end
return lost
"""

# KEYS: sessions held by the caller, grouped by request; ARGV[1]: the 8-byte revision it
# holds of each, one after the other; ARGV[2]: each group's size (u32 LE). Returns per key 0
# when the store holds that revision, else the store's record ("" when it has none). A
# group with any key not current gets every key's record: a batch that ran before this
# answer came back (``CachedSessionStore.confirm``) restores the whole request from them.
VALIDATE_LUA = _CURRENT_LUA + """
local held, sizes = ARGV[1], ARGV[2]
local out = {}
local last = 0
for g = 1, #sizes / 4 do
  local first = last + 1
  last = last + struct.unpack('<I4', sizes, 4 * g - 3)
  local ok = current(first, last, held, nil)
  for i = first, last do
    if ok then
      out[i] = 0
    else
      out[i] = redis.call('GET', KEYS[i]) or ''
    end
  end
end
return out
"""


# KEYS: the keys a transaction's MSET just wrote; ARGV[1]: their TTL in ms. Sent with EVAL
# (not EVALSHA) inside MULTI: a script the server lost would otherwise fail only at EXEC,
# after the MSET had stored the records without their TTLs.
TTL_LUA = """
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
end
return #KEYS
"""
