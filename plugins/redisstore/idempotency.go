package redisstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/store"
)

// Payment identifiers (store.PaymentIDs): one hash per id, s (0 bound, 1
// done), u (until, ms), f (the bound payment's fingerprint), a (the saved
// answer). The key expires at u and the scripts compare u with now, so a
// binding is never live at or after its until. Each operation is one
// script on one key, so the keys spread over a Cluster (an id is
// [a-zA-Z0-9_-], which cannot spell a hash tag).
//
// Each script is safe to run twice: a repeated Bind finds its own binding
// (the gateway treats a binding to its own fingerprint as its own), a
// repeated Save finds its answer saved, a repeated Unbind finds nothing.

// paymentIDFields are the bounds of a binding's fields (fits): what Save
// and Bind ever write.
var paymentIDFields = `{s = ` + strconv.Itoa(maxShortField) + `, u = ` + strconv.Itoa(maxShortField) +
	`, f = ` + strconv.Itoa(store.MaxPaymentIDFingerprint) + `, a = ` + strconv.Itoa(store.MaxPaymentIDAnswerBytes) + `}`

// livePaymentID sets v to the live binding of KEYS[1], {s, u, f, a}, or
// nil, reading its fields only once their lengths are within bounds.
var livePaymentID = fitsFn + `local v = redis.call('HMGET', KEYS[1], 's', 'u')
if v[1] and tonumber(v[2]) > now then
  fits(KEYS[1], ` + paymentIDFields + `)
  v = redis.call('HMGET', KEYS[1], 's', 'u', 'f', 'a')
else
  v = nil
end
`

// paymentIDBindScript: KEYS[1]; ARGV fingerprint, until ms. Returns {1}
// when it bound, {2} when until is not in the future, or {0, s, u, f, a},
// the live binding it found.
var paymentIDBindScript = redis.NewScript(`#!lua
` + nowMS + livePaymentID + `if v then return {0, v[1], v[2], v[3], v[4]} end
local untl = tonumber(ARGV[2])
if untl <= now then return {2} end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', '0', 'u', ARGV[2], 'f', ARGV[1], 'a', '')
redis.call('PEXPIREAT', KEYS[1], untl)
return {1}
`)

// paymentIDLookupScript: KEYS[1]; returns {} or {s, u, f, a}.
var paymentIDLookupScript = redis.NewScript(`#!lua flags=no-writes
` + nowMS + livePaymentID + `return v or {}
`)

// paymentIDSaveScript: KEYS[1]; ARGV fingerprint, answer, until ms.
// Returns 1, or 0 when the id is bound to another fingerprint.
var paymentIDSaveScript = redis.NewScript(`#!lua
` + nowMS + `local v = redis.call('HMGET', KEYS[1], 's', 'u', 'f')
if v[1] and tonumber(v[2]) > now then
  if v[3] ~= ARGV[1] then return 0 end
  if v[1] == '1' then return 1 end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', '1', 'u', ARGV[3], 'f', ARGV[1], 'a', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], tonumber(ARGV[3]))
return 1
`)

// paymentIDUnbindScript: KEYS[1]; ARGV fingerprint. Drops a live, unfinished
// binding to that fingerprint. Returns 1.
var paymentIDUnbindScript = redis.NewScript(`#!lua
` + nowMS + `local v = redis.call('HMGET', KEYS[1], 's', 'u', 'f')
if v[1] == '0' and tonumber(v[2]) > now and v[3] == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
`)

// PaymentIDs returns the payment identifiers.
func (s *Store) PaymentIDs() store.PaymentIDs { return paymentIDs{s} }

type paymentIDs struct{ s *Store }

// key spells the id in hex, like the allowance keys: the store takes any
// bytes, and hex can never form a hash tag.
func (p paymentIDs) key(id string) string {
	return p.s.opts.Prefix + ":p:" + hex.EncodeToString([]byte(id))
}

// errCorruptPaymentID reports a binding the scripts would not have
// written: a field malformed, or over its bound (paymentIDFields).
var errCorruptPaymentID = errors.New("redisstore: corrupt payment identifier record")

// paymentIDState decodes {s, u, f, a} as the scripts return them.
func paymentIDState(v []any) (store.PaymentIDState, error) {
	if len(v) != 4 {
		return store.PaymentIDState{}, errCorruptPaymentID
	}
	s, _ := v[0].(string)
	u, _ := v[1].(string)
	f, _ := v[2].(string)
	a, _ := v[3].(string)
	ms, err := strconv.ParseInt(u, 10, 64)
	if err != nil || (s != "0" && s != "1") {
		return store.PaymentIDState{}, errCorruptPaymentID
	}
	st := store.PaymentIDState{Fingerprint: f, Done: s == "1", Until: time.UnixMilli(ms).UTC()}
	if a != "" {
		st.Answer = []byte(a)
	}
	return st, nil
}

// Bind implements store.PaymentIDs.
func (p paymentIDs) Bind(ctx context.Context, id, fp string, until time.Time) (store.PaymentIDState, bool, error) {
	if err := store.CheckPaymentID(id, fp, nil); err != nil {
		return store.PaymentIDState{}, false, err
	}
	v, err := p.s.write(ctx, paymentIDBindScript, []string{p.key(id)}, fp, ceilMS(until))
	if corrupt(err) {
		return store.PaymentIDState{}, false, errCorruptPaymentID
	}
	if err != nil {
		return store.PaymentIDState{}, false, fmt.Errorf("redisstore: binding payment identifier: %w", err)
	}
	out, _ := v.([]any)
	switch {
	case len(out) == 1 && out[0] == int64(1):
		return store.PaymentIDState{Fingerprint: fp, Until: until}, true, nil
	case len(out) == 1 && out[0] == int64(2):
		return store.PaymentIDState{}, false, errors.New("store: binding expiry is not in the future")
	case len(out) == 5 && out[0] == int64(0):
		st, err := paymentIDState(out[1:])
		return st, false, err
	}
	return store.PaymentIDState{}, false, fmt.Errorf("redisstore: unexpected bind answer %v", v)
}

// Lookup implements store.PaymentIDs.
func (p paymentIDs) Lookup(ctx context.Context, id string) (store.PaymentIDState, error) {
	if id == "" || len(id) > store.MaxPaymentIDBytes {
		return store.PaymentIDState{}, store.ErrNotFound
	}
	v, err := p.s.read(ctx, paymentIDLookupScript, []string{p.key(id)})
	if corrupt(err) {
		return store.PaymentIDState{}, errCorruptPaymentID
	}
	if err != nil {
		return store.PaymentIDState{}, fmt.Errorf("redisstore: reading payment identifier: %w", err)
	}
	out, _ := v.([]any)
	if len(out) == 0 {
		return store.PaymentIDState{}, store.ErrNotFound
	}
	return paymentIDState(out)
}

// Save implements store.PaymentIDs.
func (p paymentIDs) Save(ctx context.Context, id, fp string, answer []byte, until time.Time) error {
	if err := store.CheckPaymentID(id, fp, answer); err != nil {
		return err
	}
	v, err := p.s.write(ctx, paymentIDSaveScript, []string{p.key(id)}, fp, answer, ceilMS(until))
	if err != nil {
		return fmt.Errorf("redisstore: saving payment identifier answer: %w", err)
	}
	if v != int64(1) {
		return store.ErrPaymentIDTaken
	}
	return nil
}

// Unbind implements store.PaymentIDs.
func (p paymentIDs) Unbind(ctx context.Context, id, fp string) error {
	if err := store.CheckPaymentID(id, fp, nil); err != nil {
		return err
	}
	if _, err := p.s.write(ctx, paymentIDUnbindScript, []string{p.key(id)}, fp); err != nil {
		return fmt.Errorf("redisstore: unbinding payment identifier: %w", err)
	}
	return nil
}

// PaymentIDs returns the shared payment identifiers.
func (s *RedisStore) PaymentIDs() store.PaymentIDs { return s.store.PaymentIDs() }

var _ store.PaymentIDs = paymentIDs{}
