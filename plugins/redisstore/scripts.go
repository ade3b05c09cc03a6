package redisstore

import (
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/store"
)

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
//
// The day is the server's: the gateway names the day its own clock says,
// moved by how far the server's clock was from it last time (a guess),
// and a script whose server time is outside it changes nothing and
// answers {2, now}, for the gateway to ask again on the server's day
// (Store.onServerDay). So every gateway counts one client's calls in
// one day at one instant, whatever its clock. A reservation names its day,
// so its commit or release goes to the record it was counted in, after
// midnight too (the record lives a day past its day).

// onDay refuses a script whose server time is outside the day from
// ARGV[1] to ARGV[2] (ms, end excluded).
const onDay = `if now < tonumber(ARGV[1]) or now >= tonumber(ARGV[2]) then return {2, now} end
`

// reserveScript: KEYS[1] the client-day; ARGV day start, day end (ms),
// limit, ttl ms, id. Returns {1, remaining, lifetime left (ms)}, {0}, or
// {2, now} (onDay): the lifetime, not the server's expiry, so that the
// gateway judges it by its own elapsed time, whatever its clock says
// (allowance.Reserve).
var reserveScript = redis.NewScript(`#!lua
` + nowMS + onDay + `local key, limit, ttl, id = KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
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
redis.call('PEXPIREAT', key, tonumber(ARGV[2]) + 86400000)
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

// remainingScript: KEYS[1] the client-day; ARGV day start, day end (ms),
// limit. Counts committed and live pending units: {1, remaining}, or
// {2, now} (onDay).
var remainingScript = redis.NewScript(`#!lua flags=no-writes
` + nowMS + onDay + `local used = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
return {1, math.max(0, tonumber(ARGV[3]) - used)}
`)

// Bounds on what a script sends back. A record over what the store ever
// writes (planted in a shared Redis by another deployment or by hand) is
// refused before any of it is sent: the script fails with corruptReply,
// which the gateway reports as a corrupt record (a 503), instead of
// reading and decoding it, however large, for every request that names
// it. maxShortField bounds the fields that are a number, a token or a key
// name.
const (
	corruptCode   = "AOVCORRUPT"
	corruptReply  = corruptCode + " record over the bounds of what the store writes"
	maxShortField = 64 << 10
)

// fitsFn defines fitting(k, fields): whether every field of hash k named
// in fields (field = bound) is within its bound, read by its length alone;
// and fits(k, fields), which raises corruptReply unless so.
const fitsFn = `local function fitting(k, fields)
  for f, max in pairs(fields) do
    if redis.call('HSTRLEN', k, f) > max then return false end
  end
  return true
end
local function fits(k, fields)
  if not fitting(k, fields) then error({err = '` + corruptReply + `'}) end
end
`

// claimFields are the bounds of a claim key's fields a script sends back
// (its note, state, until and ref).
var claimFields = `{n = ` + strconv.Itoa(store.MaxHoldNoteBytes) + `, s = ` + strconv.Itoa(maxShortField) +
	`, u = ` + strconv.Itoa(maxShortField) + `, r = ` + strconv.Itoa(maxShortField) + `}`

// A claim is one hash per key: s (0 pending, 1 settled), t (the holder's
// token), u (until, ms), and for a held claim a (the end of its attempt
// span, ms, on the server's clock like u). The key expires at u; the
// scripts also compare u with now, so a key is never live at or after its
// until.
//
// The claim's note (n) is on its first key alone; each other key carries
// r, the first key's name as stored, instead. A note is a paid call's
// record (kilobytes, up to a held answer of a MiB), and an EVM claim has
// two keys: under each, every held call cost its note twice in the
// server's memory, which noeviction turns into refused payments once full.
// Every key of a claim is written by one script and lapses at one u, so a
// ref never outlives its note; a ref is followed only to a key holding the
// same live claim (same t, itself no ref), so a stray one serves no note,
// never its target's name or another claim's note. A key with no r carries
// its own n: every key a build before refs wrote, and every claim of one
// key. An older build reads a ref key as having no note (README: upgrade
// every gateway on one Redis together).
//
// A script reads only the keys it is given (KEYS), as Redis requires; all
// claim keys share one hash tag, so a claim's keys are always on one slot,
// but a ref may name a key its caller did not (a retry naming a payment by
// its second key alone). Such a script answers with the ref instead
// (noteOf), and the gateway reads the claim again declaring its target
// (claims.lookup).

// noteOf is the note of live claim key k whose t and r are given: its own
// without a ref; with one, the note of the key r names when that key
// holds the same live claim, else the empty string; nil when r is not
// among KEYS, for the caller to ask again naming it. Every key whose
// fields it reads is checked against claimFields first (fits), so a note
// is read only once its length is known to be within bounds.
var noteOf = fitsFn + `local function noteOf(k, t, r)
  fits(k, ` + claimFields + `)
  if not r then return redis.call('HGET', k, 'n') or '' end
  local declared = false
  for _, d in ipairs(KEYS) do
    if d == r then declared = true break end
  end
  if not declared then return nil end
  local f = redis.call('HMGET', r, 't', 'u', 'r')
  if f[1] == t and tonumber(f[2]) > now and not f[3] then
    fits(r, ` + claimFields + `)
    return redis.call('HGET', r, 'n') or ''
  end
  return ''
end
`

// putNote writes note on the first of KEYS and a ref to it on the others
// (dropping a note one carries from a build before refs), with the fields
// given after it on each.
const putNote = `local function putNote(i, k, note, ...)
  if i == 1 then
    redis.call('HSET', k, 'n', note, ...)
  else
    redis.call('HSET', k, 'r', KEYS[1], ...)
    redis.call('HDEL', k, 'n')
  end
end
`

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
// note, attempt} naming the first live key held by someone else, or
// {3, i, ref} when that key's note is under ref, a key not among KEYS
// (noteOf).
var claimScript = redis.NewScript(`#!lua
` + nowMS + attemptOf + noteOf + `local note, attempt = '', nil
` + claimBody + `return {1}
`)

// claimBody claims KEYS for ARGV[1] (token) until ARGV[2] (ms) with note
// and, unless nil, attempt (the a field), or returns as claimScript says.
const claimBody = `local token, untl = ARGV[1], tonumber(ARGV[2])
if untl <= now then return {2} end
for i, k in ipairs(KEYS) do
  local v = redis.call('HMGET', k, 's', 't', 'u', 'a', 'r')
  if v[1] and tonumber(v[3]) > now then
    if v[2] == token then return {1} end
    local n = noteOf(k, v[2], v[5])
    if not n then return {3, i, v[5]} end
    return {0, i, v[1], v[3], n, attemptOf(v[4])}
  end
end
for i, k in ipairs(KEYS) do
  redis.call('DEL', k)
  local nk, nv = 'n', note
  if i > 1 then nk, nv = 'r', KEYS[1] end
  if attempt then
    redis.call('HSET', k, 's', '0', 't', token, 'u', ARGV[2], nk, nv, 'a', attempt)
  else
    redis.call('HSET', k, 's', '0', 't', token, 'u', ARGV[2], nk, nv)
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
` + nowMS + attemptOf + noteOf + `local index = table.remove(KEYS)
local note, attempt = ARGV[3], string.format('%d', now + tonumber(ARGV[5]))
` + claimBody + `redis.call('ZADD', index, untl, ARGV[4])
redis.call('PEXPIREAT', index, math.max(untl, tonumber(redis.call('PEXPIRETIME', index))))
return {1}
`)

// heldCheck returns 0 from the script unless every key is live and holds
// ARGV[1], and none but the first refers to the first (as store.held: a
// key that refers elsewhere is not of this claim).
const heldCheck = `for i, k in ipairs(KEYS) do
  local v = redis.call('HMGET', k, 't', 'u', 'r')
  if v[1] ~= ARGV[1] or tonumber(v[2]) <= now or (v[3] and (i == 1 or v[3] ~= KEYS[1])) then return 0 end
end
`

// settleScript: KEYS the claim keys, then the index of held claims; ARGV
// token, note, keep-until ms (0: keep the current until), the claim's
// first key. Returns 1, or 0 when the claim is lost. A settled claim
// leaves the index (unindex).
var settleScript = redis.NewScript(`#!lua
` + nowMS + putNote + unindex + heldCheck + `local keep = tonumber(ARGV[3])
for i, k in ipairs(KEYS) do
  local u = math.max(tonumber(redis.call('HGET', k, 'u')), keep)
  putNote(i, k, ARGV[2], 's', '1', 'u', string.format('%d', u))
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
// Writes a settled claim, with its own note (a claim of one key), unless a
// live settled one lasting until then or later is there (store.Claims.Record:
// a longer record renews it). Returns 1 when written, 0 when kept, 2 when
// until is not in the future.
var recordScript = redis.NewScript(`#!lua
` + nowMS + `local untl = tonumber(ARGV[2])
if untl <= now then return 2 end
local v = redis.call('HMGET', KEYS[1], 's', 'u')
if v[1] == '1' and tonumber(v[2]) > now and tonumber(v[2]) >= untl then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', '1', 't', ARGV[1], 'u', ARGV[2], 'n', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], untl)
return 1
`)

// lookupScript: KEYS[1], and optionally the key its ref names; returns {}
// or {settled, until, note, attempt}, or {ref} when KEYS[1]'s note is under
// ref, a key not among KEYS (noteOf).
var lookupScript = redis.NewScript(`#!lua flags=no-writes
` + nowMS + attemptOf + noteOf + `local v = redis.call('HMGET', KEYS[1], 's', 'u', 'a', 't', 'r')
if not v[1] or tonumber(v[2]) <= now then return {} end
local n = noteOf(KEYS[1], v[4], v[5])
if not n then return {v[5]} end
return {v[1], v[2], n, attemptOf(v[3])}
`)
