package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/store"
)

// Held answers: when a settlement's outcome is unknown the gateway keeps the
// payment and the answer it held back as a note on the still-unsettled
// claim (Hold), and looks for such claims later to resolve them (Held). The
// claims keep an index of held claims (a sorted set by expiry, in the
// claims' hash tag so it shares their Cluster slot) so Held does not scan
// the keyspace.

// holdScript: KEYS the claim keys, then the index; ARGV token, note, the
// caller's first key. Returns 1, 0 when the claim is lost, 2 when settled.
var holdScript = redis.NewScript(`#!lua
` + nowMS + putNote + `local index = table.remove(KEYS)
` + heldCheck + `for _, k in ipairs(KEYS) do
  if redis.call('HGET', k, 's') == '1' then return 2 end
end
for i, k in ipairs(KEYS) do
  putNote(i, k, ARGV[2])
end
local u = tonumber(redis.call('HGET', KEYS[1], 'u'))
redis.call('ZADD', index, u, ARGV[3])
redis.call('PEXPIREAT', index, math.max(u, tonumber(redis.call('PEXPIRETIME', index))))
return 1
`)

// heldScript: KEYS[1] the index; ARGV the claim key prefix. Drops lapsed
// and finished entries and returns the first keys of live, unsettled claims
// that carry a note.
var heldScript = redis.NewScript(`#!lua
` + nowMS + `redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local v = redis.call('HMGET', ARGV[1] .. m, 's', 'u', 'n')
  if v[1] == '0' and tonumber(v[2]) > now and v[3] ~= '' then
    table.insert(out, m)
  else
    redis.call('ZREM', KEYS[1], m)
  end
end
return out
`)

// indexedKeys is keys as stored (claims.keys), followed by the index of
// held claims (in the claims' hash tag, so in their Cluster slot), in one
// allocation: how every script that indexes a claim, or ends one, is
// given them.
func (c claims) indexedKeys(keys []string) []string {
	out := make([]string, len(keys), len(keys)+1)
	for i, k := range keys {
		out[i] = c.s.claimPrefix + k
	}
	return append(out, c.s.heldIndex)
}

// swapScript: KEYS the claim keys, then the index of held claims; ARGV
// token, old note, note, the claim's first key. Marks the claim settled
// with note if it still carries old (on its first key, and on any other
// that carries a note of its own: written before refs), and takes it off
// the index. Returns 1, 0 when the claim is lost, 3 when the note changed.
var swapScript = redis.NewScript(`#!lua
` + nowMS + putNote + unindex + heldCheck + `for i, k in ipairs(KEYS) do
  local n = redis.call('HGET', k, 'n')
  if (i == 1 or n) and n ~= ARGV[2] then return 3 end
end
for i, k in ipairs(KEYS) do
  putNote(i, k, ARGV[3], 's', '1')
end
redis.call('ZREM', index, ARGV[4])
return 1
`)

// Swap implements store.HeldClaims. Run twice (go-redis resends a command
// whose answer was lost), the second run finds the new note and reports
// store.ErrNoteChanged: the caller takes that as another's move and does
// not act on the old note, which errs on the side of delivering nothing
// twice.
func (c claims) Swap(ctx context.Context, cl store.Claim, old, note string) error {
	if err := store.CheckHoldNote(note); err != nil {
		return err
	}
	if !validClaim(cl) {
		return store.ErrClaimLost
	}
	v, err := c.s.write(ctx, swapScript, c.indexedKeys(cl.Keys), cl.Token, old, note, cl.Keys[0])
	if err != nil {
		return fmt.Errorf("redisstore: swapping claim note: %w", err)
	}
	switch v {
	case int64(1):
		return nil
	case int64(3):
		return store.ErrNoteChanged
	}
	return store.ErrClaimLost
}

// ClaimHeld implements store.HeldClaims: the span's end is kept on the
// server's clock (claimHeldScript), and Lookup, Held and a ClaimedError
// report where it stands by that clock.
func (c claims) ClaimHeld(ctx context.Context, keys []string, until time.Time, span time.Duration, note func(store.Claim) (string, error)) (store.Claim, error) {
	return c.claim(ctx, keys, until, span, note)
}

// Session implements store.HeldClaims: "" as the store is shared by every
// gateway that names it, so a note's writer may be alive on another.
func (claims) Session() string { return "" }

// Hold writes note on c, which must still be c's and unsettled
// (store.ErrClaimLost, store.ErrClaimSettled otherwise).
func (c claims) Hold(ctx context.Context, cl store.Claim, note string) error {
	if err := store.CheckHoldNote(note); err != nil {
		return err
	}
	if !validClaim(cl) {
		return store.ErrClaimLost
	}
	v, err := c.s.write(ctx, holdScript, c.indexedKeys(cl.Keys), cl.Token, note, cl.Keys[0])
	if err != nil {
		return fmt.Errorf("redisstore: holding claim: %w", err)
	}
	switch v {
	case int64(1):
		return nil
	case int64(2):
		return store.ErrClaimSettled
	}
	return store.ErrClaimLost
}

// Held calls fn with the first key and the state of every live, unsettled
// claim that carries a note, until fn returns false.
func (c claims) Held(ctx context.Context, fn func(key string, st store.ClaimState) bool) error {
	v, err := c.s.write(ctx, heldScript, []string{c.s.heldIndex}, c.s.claimPrefix)
	if err != nil {
		return fmt.Errorf("redisstore: listing held claims: %w", err)
	}
	keys, _ := v.([]any)
	for _, k := range keys {
		key, _ := k.(string)
		st, err := c.Lookup(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			continue // settled, released or lapsed since
		}
		if err != nil {
			return err
		}
		if st.Settled || st.Note == "" {
			continue
		}
		if !fn(key, st) {
			return nil
		}
	}
	return nil
}

var _ store.HeldClaims = claims{}
