package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/store"
)

// The discovery list is two keys under one hash tag (prefix:{d}:), so each
// script touches one Cluster slot:
//
//	prefix:{d}:z  sorted set: member = resource, score = minus its last-seen time (ms),
//	              so ascending order is most recently seen first, then by resource
//	prefix:{d}:e  hash: resource+"\0t" type, "\0x" extension names (newline-separated),
//	              "\0i" item, "\0n" number of ways to pay, "\0k"+i and "\0r"+i the
//	              i-th way's identity (scheme, network, asset, payTo, NUL-separated)
//	              and requirements, "\0f" what a filtered list reads (type, the
//	              extension names, each identity; one HGET per entry), "\0w" the
//	              writer's rank (store.DiscoveryEntry.Rank)
//	prefix:{d}:p:<payment>  string: the resource a settled payment listed,
//	              expiring MaxAge after it was recorded
//
// store.CheckDiscoveryEntry refuses control characters in every name, so
// the NUL and newline separators are unambiguous. Both keys expire MaxAge
// after the last record; each entry's age is judged by its score.

const discoveryDel = `local function del(m)
  local n = tonumber(redis.call('HGET', h, m .. '\0n') or '0')
  local f = {m .. '\0t', m .. '\0x', m .. '\0i', m .. '\0n', m .. '\0f', m .. '\0w'}
  for i = 1, n do f[#f + 1] = m .. '\0k' .. i; f[#f + 1] = m .. '\0r' .. i end
  redis.call('HDEL', h, unpack(f))
  redis.call('ZREM', z, m)
end
`

// discoveryRecordScript: KEYS z, e and, when the entry names its payment,
// that payment's key; ARGV max entries, max age (ms), max accepts,
// resource, type, extensions, item, rank, replace ("1": the entry's
// ReplaceAccepts), then identity and requirements of each way to pay. The
// old ways to pay are kept and merged only as store.KeepDiscoveryAccepts
// says: unless replace, and only under a writer of the same rank. Returns 1 (recorded), 2 (the payment listed another
// resource) or 3 (the live entry has a higher rank); 2 and 3 change
// nothing. Safe to run twice: it sets the same entry again.
var discoveryRecordScript = redis.NewScript(`#!lua
` + nowMS + `local z, h = KEYS[1], KEYS[2]
local max, age, maxacc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local res, rank = ARGV[4], tonumber(ARGV[8])
if KEYS[3] then
  local listed = redis.call('GET', KEYS[3])
  if listed and listed ~= res then return 2 end
end
` + discoveryDel + `for _, m in ipairs(redis.call('ZRANGEBYSCORE', z, '(' .. (age - now), '+inf')) do del(m) end
local n = 0
if redis.call('ZSCORE', z, res) then
  local old = tonumber(redis.call('HGET', h, res .. '\0w') or '0')
  if old > rank then return 3 end
  n = tonumber(redis.call('HGET', h, res .. '\0n') or '0')
  if ARGV[9] == '1' or old < rank then
    local f = {}
    for i = 1, n do f[#f + 1] = res .. '\0k' .. i; f[#f + 1] = res .. '\0r' .. i end
    if n > 0 then redis.call('HDEL', h, unpack(f)) end
    n = 0
  end
else
  while redis.call('ZCARD', z) >= max do del(redis.call('ZRANGE', z, -1, -1)[1]) end
end
redis.call('HSET', h, res .. '\0t', ARGV[5], res .. '\0x', ARGV[6], res .. '\0i', ARGV[7], res .. '\0w', rank)
for j = 10, #ARGV, 2 do
  local slot
  for i = 1, n do
    if redis.call('HGET', h, res .. '\0k' .. i) == ARGV[j] then slot = i; break end
  end
  if not slot and n < maxacc then n = n + 1; slot = n end
  if slot then redis.call('HSET', h, res .. '\0k' .. slot, ARGV[j], res .. '\0r' .. slot, ARGV[j + 1]) end
end
redis.call('HSET', h, res .. '\0n', n)
local ids = {}
for i = 1, n do ids[i] = redis.call('HGET', h, res .. '\0k' .. i) end
redis.call('HSET', h, res .. '\0f', ARGV[5] .. '\n' .. (string.gsub(ARGV[6], '\n', '\2')) .. '\n' .. table.concat(ids, '\n'))
redis.call('ZADD', z, -now, res)
redis.call('PEXPIRE', z, age)
redis.call('PEXPIRE', h, age)
if KEYS[3] then redis.call('SET', KEYS[3], res, 'PX', age) end
return 1
`)

// discoveryListScript: KEYS z, e; ARGV max age (ms), max entries, offset,
// limit, type, extension, scheme, network, payTo, max bytes (0: any), max
// item bytes. Returns {total, then per listed entry: resource, -score,
// type, extensions, item, n, n × (identity, requirements)}; an entry with
// a field over what Record writes (planted by hand or by another
// deployment) or a count of ways to pay it never writes is listed as
// resource ("" when that is over its bound), -score, "", "", "",
// corruptEntry, its fields read by
// their length alone (fitting) and none of them sent. A field of the
// filter (\0f) over its bound reads as missing: the entry matches no
// filter.
var discoveryListScript = redis.NewScript(`#!lua flags=no-writes
` + nowMS + fitsFn + `local z, h = KEYS[1], KEYS[2]
local age, max, offset, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local typ, ext, scheme, network, payto = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local maxbytes, maxitem, size, full = tonumber(ARGV[10]), tonumber(ARGV[11]), 0, false
local short, maxres = ` + strconv.Itoa(maxShortField) + `, ` + strconv.Itoa(store.MaxDiscoveryResourceBytes) + `
local maxacc, maxraw = ` + strconv.Itoa(store.MaxDiscoveryAccepts) + `, ` + strconv.Itoa(store.MaxDiscoveryAcceptBytes) + `
local corrupt = ` + strconv.Itoa(corruptEntry) + `
local function split(s, sep)
  local r, i = {}, 1
  while true do
    local j = string.find(s, sep, i, true)
    if not j then r[#r + 1] = string.sub(s, i); return r end
    r[#r + 1] = string.sub(s, i, j - 1); i = j + 1
  end
end
-- entry is member m's listed fields and the bytes of its item and
-- requirements, each field read only once its length is known to be
-- within what Record writes.
local function entry(m, score)
  if #m > maxres then return {'', score, '', '', '', corrupt}, 0 end
  local bad = {m, score, '', '', '', corrupt}
  if not fitting(h, {[m .. '\0n'] = short, [m .. '\0t'] = short, [m .. '\0x'] = short, [m .. '\0i'] = maxitem}) then return bad, 0 end
  local n = tonumber(redis.call('HGET', h, m .. '\0n') or '0')
  if not n or n < 0 or n > maxacc or n ~= math.floor(n) then return bad, 0 end
  local ways = {}
  for k = 1, n do ways[m .. '\0k' .. k] = short; ways[m .. '\0r' .. k] = maxraw end
  if not fitting(h, ways) then return bad, 0 end
  local e = {m, score, redis.call('HGET', h, m .. '\0t') or '', redis.call('HGET', h, m .. '\0x') or '', redis.call('HGET', h, m .. '\0i') or 'null', n}
  local bytes = #e[5]
  for k = 1, n do
    e[#e + 1] = redis.call('HGET', h, m .. '\0k' .. k) or ''
    e[#e + 1] = redis.call('HGET', h, m .. '\0r' .. k) or 'null'
    bytes = bytes + #e[#e]
  end
  return e, bytes
end
-- add appends the entry to out unless the page is full (limit entries,
-- or max bytes of items and requirements with at least one entry).
local function add(out, m, score)
  if full or #out >= limit then full = true; return end
  local e, bytes = entry(m, score)
  if maxbytes > 0 and #out > 0 and size + bytes > maxbytes then full = true; return end
  size = size + bytes
  out[#out + 1] = e
end
if typ == '' and ext == '' and scheme == '' and network == '' and payto == '' then
  -- Every live entry matches: only the page is read.
  local total = math.min(redis.call('ZCOUNT', z, '-inf', age - now), max)
  local out = {}
  if offset < total then
    local page = redis.call('ZRANGEBYSCORE', z, '-inf', age - now, 'WITHSCORES', 'LIMIT', offset, math.min(limit, total - offset))
    for i = 1, #page, 2 do
      local m = page[i]
      add(out, m, page[i + 1])
    end
  end
  return {total, out}
end
local members = redis.call('ZRANGEBYSCORE', z, '-inf', age - now, 'WITHSCORES', 'LIMIT', 0, max)
local total, out = 0, {}
for i = 1, #members, 2 do
  local m = members[i]
  local f = fitting(h, {[m .. '\0f'] = short}) and redis.call('HGET', h, m .. '\0f')
  if f then
    local parts = split(f, '\n')
    if (typ == '' or parts[1] == typ) and (ext == '' or string.find('\2' .. parts[2] .. '\2', '\2' .. ext .. '\2', 1, true)) then
      local ok = scheme == '' and network == '' and payto == ''
      for k = 3, #parts do
        if ok then break end
        local p = split(parts[k], '\0')
        ok = (scheme == '' or p[1] == scheme) and (network == '' or p[2] == network) and (payto == '' or p[4] == payto)
      end
      if ok then
        total = total + 1
        if total > offset and not full then add(out, m, members[i + 1]) end
      end
    end
  end
end
return {total, out}
`)

// corruptEntry is the count of ways to pay discoveryListScript gives an
// entry it lists as corrupt.
const corruptEntry = -1

// Discovery returns the facilitator's discovery list bounded by l (zero
// fields: the defaults), shared by every instance on this Redis and prefix.
func (s *Store) Discovery(l store.DiscoveryLimits) store.Discovery {
	p := s.opts.Prefix + ":{d}:"
	return discovery{s: s, lim: l.WithDefaults(), keys: []string{p + "z", p + "e"}, payments: p + "p:"}
}

type discovery struct {
	s        *Store
	lim      store.DiscoveryLimits
	keys     []string
	payments string // the prefix of a payment's key
}

// Limits implements store.Discovery.
func (d discovery) Limits() store.DiscoveryLimits { return d.lim }

// Record implements store.Discovery.
func (d discovery) Record(ctx context.Context, e store.DiscoveryEntry) error {
	if err := store.CheckDiscoveryEntry(e, d.lim); err != nil {
		return err
	}
	replace := "0"
	if e.ReplaceAccepts {
		replace = "1"
	}
	args := []any{d.lim.MaxEntries, d.lim.MaxAge.Milliseconds(), store.MaxDiscoveryAccepts,
		e.Resource, e.Type, strings.Join(e.Extensions, "\n"), string(e.Item), e.Rank, replace}
	for _, a := range e.Accepts {
		args = append(args, a.Scheme+"\x00"+a.Network+"\x00"+a.Asset+"\x00"+a.PayTo, string(a.Raw))
	}
	keys := d.keys
	if e.Payment != "" {
		keys = []string{d.keys[0], d.keys[1], d.payments + e.Payment}
	}
	v, err := d.s.write(ctx, discoveryRecordScript, keys, args...)
	if err != nil {
		return err
	}
	switch v {
	case int64(2):
		return store.ErrDiscoveryPaymentUsed
	case int64(3):
		return store.ErrDiscoveryOutranked
	}
	return nil
}

// List implements store.Discovery.
func (d discovery) List(ctx context.Context, q store.DiscoveryQuery) (store.DiscoveryPage, error) {
	v, err := d.s.read(ctx, discoveryListScript, d.keys, d.lim.MaxAge.Milliseconds(), d.lim.MaxEntries,
		q.Offset, q.Limit, q.Type, q.Extension, q.Scheme, q.Network, q.PayTo, max(q.MaxBytes, 0), d.lim.MaxItemBytes)
	if err != nil {
		return store.DiscoveryPage{}, err
	}
	bad := errors.New("redisstore: malformed discovery list reply")
	top, ok := v.([]any)
	if !ok || len(top) != 2 {
		return store.DiscoveryPage{}, bad
	}
	total, _ := top[0].(int64)
	rows, _ := top[1].([]any)
	page := store.DiscoveryPage{Total: int(total), Entries: make([]store.DiscoveryEntry, 0, len(rows))}
	for _, r := range rows {
		f, ok := r.([]any)
		if !ok || len(f) < 6 {
			return store.DiscoveryPage{}, bad
		}
		str := func(i int) string { s, _ := f[i].(string); return s }
		score, err := strconv.ParseFloat(str(1), 64)
		n, _ := f[5].(int64)
		if err == nil && n == corruptEntry && len(f) == 6 {
			// Over the bounds of what Record writes: it keeps its place,
			// with no item, as store.Discovery says.
			page.Entries = append(page.Entries, store.DiscoveryEntry{Resource: str(0), LastSeen: time.UnixMilli(int64(-score))})
			continue
		}
		if err != nil || n < 0 || len(f) != 6+2*int(n) {
			return store.DiscoveryPage{}, bad
		}
		e := store.DiscoveryEntry{Resource: str(0), Type: str(2), Item: json.RawMessage(str(4)), LastSeen: time.UnixMilli(int64(-score))}
		if x := str(3); x != "" {
			e.Extensions = strings.Split(x, "\n")
		}
		for k := range int(n) {
			id := strings.Split(str(6+2*k), "\x00")
			if len(id) != 4 {
				// A way to pay whose identity is gone (a hash field
				// deleted): the entry keeps its place, given back with no
				// item for the reader to skip, as store.Discovery says.
				e.Item, e.Accepts = nil, nil
				break
			}
			e.Accepts = append(e.Accepts, store.DiscoveryAccept{Scheme: id[0], Network: id[1], Asset: id[2], PayTo: id[3], Raw: json.RawMessage(str(7 + 2*k))})
		}
		page.Entries = append(page.Entries, e)
	}
	return page, nil
}

// Discovery returns the facilitator's discovery list (see Store.Discovery).
func (s *RedisStore) Discovery(l store.DiscoveryLimits) store.Discovery { return s.store.Discovery(l) }
