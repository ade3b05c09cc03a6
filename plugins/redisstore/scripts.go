package redisstore

import "github.com/redis/go-redis/v9"

// Every operation is one Lua script, so it is atomic on the server (and in
// a Cluster on the one slot its keys share). Each script reads the time
// from the server (redis.call('TIME')): every gateway instance judges
// expiry by one clock, whatever its own says.
//
// Each script starts with a #!lua shebang line. Without it Redis checks
// its memory limit only at a script's first write, so scripts could push
// the server far past maxmemory; with it a write is refused up front when
// memory is full, and the store fails closed. Read-only scripts say so
// (flags=no-writes) and still run when memory is full.
//
// go-redis resends a command whose connection dropped even if the server
// already ran it, so each script is safe to run twice: a reservation is
// keyed by its id and a claim by its token.

// nowMS is the server's clock in milliseconds.
const nowMS = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// An allowance record is one sorted set per pool, client and UTC day:
// member = reservation id, score = the pending unit's expiry (ms), or +inf
// once committed. Lapsed pending units (score <= now) are dropped first.

// reserveScript: KEYS[1] the client-day; ARGV limit, ttl ms, id, day end
// (ms). Returns {1, remaining, lifetime left (ms)} or {0}: the lifetime,
// not the server's expiry, so that the gateway judges it by its own
// elapsed time, whatever its clock says (allowance.Reserve).
var reserveScript = redis.NewScript(`#!lua
` + nowMS + `local key, limit, ttl, id = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local n = redis.call('ZCARD', key)
local had = redis.call('ZSCORE', key, id)
if had then
  if had == 'inf' then return {0} end
  return {1, math.max(0, limit - n), tonumber(had) - now}
end
if n >= limit then return {0} end
local exp = now + ttl
redis.call('ZADD', key, exp, id)
redis.call('PEXPIREAT', key, math.max(tonumber(ARGV[4]), now) + 86400000)
return {1, limit - n - 1, ttl}
`)

// finishScript: KEYS[1] the client-day; ARGV id, "1" to commit or "0" to
// release. Returns 1 when the unit was pending and live, else 0.
var finishScript = redis.NewScript(`#!lua
` + nowMS + `local key, id = KEYS[1], ARGV[1]
local s = redis.call('ZSCORE', key, id)
if not s or s == 'inf' then return 0 end
if tonumber(s) <= now then
  redis.call('ZREM', key, id)
  return 0
end
if ARGV[2] == '1' then
  redis.call('ZADD', key, 'XX', '+inf', id)
else
  redis.call('ZREM', key, id)
end
return 1
`)

// remainingScript: KEYS[1] the client-day; ARGV limit. Counts committed
// and live pending units.
var remainingScript = redis.NewScript(`#!lua flags=no-writes
` + nowMS + `local used = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
return math.max(0, tonumber(ARGV[1]) - used)
`)

// A claim is one hash per key: s (0 pending, 1 settled), t (the holder's
// token), u (until, ms), n (note), and for a held claim a (the end of its
// attempt span, ms, on the server's clock like u). The key expires at u;
// the scripts also compare u with now, so a key is never live at or after
// its until.

// attemptOf is where a claim's attempt span (its a) stands by the server's
// clock, as store.ClaimState.Attempt says it (claimState): "1" running,
// "0" over, empty when the claim has none.
const attemptOf = `local function attemptOf(a)
  if not a then return '' end
  if tonumber(a) > now then return '1' end
  return '0'
end
`

// claimScript: KEYS the claim keys; ARGV token, until ms. Returns {1} on
// success, {2} when until is not in the future, or {0, i, settled, until,
// note, attempt} naming the first live key held by someone else.
var claimScript = redis.NewScript(`#!lua
` + nowMS + attemptOf + `local note, attempt = '', nil
` + claimBody + `return {1}
`)

// claimBody claims KEYS for ARGV[1] (token) until ARGV[2] (ms) with note
// and, unless nil, attempt (the a field), or returns as claimScript says.
const claimBody = `local token, untl = ARGV[1], tonumber(ARGV[2])
if untl <= now then return {2} end
for i, k in ipairs(KEYS) do
  local v = redis.call('HMGET', k, 's', 't', 'u', 'n', 'a')
  if v[1] and tonumber(v[3]) > now then
    if v[2] == token then return {1} end
    return {0, i, v[1], v[3], v[4], attemptOf(v[5])}
  end
end
for _, k in ipairs(KEYS) do
  redis.call('DEL', k)
  if attempt then
    redis.call('HSET', k, 's', '0', 't', token, 'u', ARGV[2], 'n', note, 'a', attempt)
  else
    redis.call('HSET', k, 's', '0', 't', token, 'u', ARGV[2], 'n', note)
  end
  redis.call('PEXPIREAT', k, untl)
end
`

// claimHeldScript is claimScript with a note (ARGV[3]) on the new claim,
// listed in the index of held claims (the last of KEYS) by its first key
// (ARGV[4]), and the end of its attempt span ARGV[5] ms from now by the
// server's clock: a gateway's own clock stamps nothing another gateway
// judges. Same answers.
var claimHeldScript = redis.NewScript(`#!lua
` + nowMS + attemptOf + `local index = table.remove(KEYS)
local note, attempt = ARGV[3], string.format('%d', now + tonumber(ARGV[5]))
` + claimBody + `redis.call('ZADD', index, untl, ARGV[4])
redis.call('PEXPIREAT', index, math.max(untl, tonumber(redis.call('PEXPIRETIME', index))))
return {1}
`)

// heldCheck returns 0 from the script unless every key is live and holds
// ARGV[1].
const heldCheck = `for _, k in ipairs(KEYS) do
  local v = redis.call('HMGET', k, 't', 'u')
  if v[1] ~= ARGV[1] or tonumber(v[2]) <= now then return 0 end
end
`

// settleScript: KEYS the claim keys, then the index of held claims; ARGV
// token, note, keep-until ms (0: keep the current until), the claim's
// first key. Returns 1, or 0 when the claim is lost. A settled claim
// leaves the index (unindex).
var settleScript = redis.NewScript(`#!lua
` + nowMS + unindex + heldCheck + `local keep = tonumber(ARGV[3])
for _, k in ipairs(KEYS) do
  local u = math.max(tonumber(redis.call('HGET', k, 'u')), keep)
  redis.call('HSET', k, 's', '1', 'n', ARGV[2], 'u', string.format('%d', u))
  redis.call('PEXPIREAT', k, u)
end
redis.call('ZREM', index, ARGV[4])
return 1
`)

// releaseScript: KEYS the claim keys, then the index of held claims; ARGV
// token, the claim's first key. Returns 1, 0 when the claim is lost, 2
// when it is settled (and kept). A released claim leaves the index.
var releaseScript = redis.NewScript(`#!lua
` + nowMS + unindex + heldCheck + `for _, k in ipairs(KEYS) do
  if redis.call('HGET', k, 's') == '1' then return 2 end
end
redis.call('DEL', unpack(KEYS))
redis.call('ZREM', index, ARGV[2])
return 1
`)

// unindex takes the index of held claims off the end of KEYS (as index),
// for a script that ends a claim: every paid call's claim is indexed with
// its record (claimHeldScript), and only one that still needs resolving
// should stay there, or the background pass (heldScript) walks every paid
// call since its last pass.
const unindex = `local index = table.remove(KEYS)
`

// recordScript: KEYS[1] the claim key; ARGV token, until ms, note.
// Writes a settled claim unless a live settled one is there. Returns 1
// when written, 0 when kept, 2 when until is not in the future.
var recordScript = redis.NewScript(`#!lua
` + nowMS + `local untl = tonumber(ARGV[2])
if untl <= now then return 2 end
local v = redis.call('HMGET', KEYS[1], 's', 'u')
if v[1] == '1' and tonumber(v[2]) > now then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', '1', 't', ARGV[1], 'u', ARGV[2], 'n', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], untl)
return 1
`)

// lookupScript: KEYS[1]; returns {} or {settled, until, note, attempt}.
var lookupScript = redis.NewScript(`#!lua flags=no-writes
` + nowMS + attemptOf + `local v = redis.call('HMGET', KEYS[1], 's', 'u', 'n', 'a')
if not v[1] or tonumber(v[2]) <= now then return {} end
return {v[1], v[2], v[3], attemptOf(v[4])}
`)
