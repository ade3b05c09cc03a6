package walletauth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aovhq/aov/store"
)

// DefaultPaidAccessTTL is how long a payment keeps granting sign-in-with-x
// access to its resource when the recorder does not say.
const DefaultPaidAccessTTL = 30 * 24 * time.Hour

// MaxPaidAccessTTL bounds PaidAccess.TTL: a year (a leap one). Access
// paid for once is meant to lapse; and a record's end must stay within
// what a store keeps (Badger stores it in Unix nanoseconds, which end in
// 2262), or every record would fail.
const MaxPaidAccessTTL = 366 * 24 * time.Hour

// PaidAccess remembers which wallet paid for which resource, so that a
// later sign-in-with-x proof from that wallet can be let through without a
// new payment. Records live in the gateway's claim store (one settled claim
// per payer and resource), so a distributed store shares them across
// gateway instances like the replay guard.
//
// A record is written settled, in one write (store.Claims.Record): a
// claim settled by a second write would stay pending for the whole TTL
// when that write failed, and every later payment would take it for
// "already recorded". It lasts TTL from the latest payment: paying again
// while it lasts renews it (the wallet was charged again), and never
// shortens it (a TTL lowered since the first payment).
type PaidAccess struct {
	Claims store.Claims
	// TTL is how long a payment grants access. Default DefaultPaidAccessTTL;
	// at most MaxPaidAccessTTL (Record refuses a longer one).
	TTL time.Duration
}

// PaidResource names a resource for PaidAccess: the request's host (without
// regard to case) and its path as sent, escaped, in CanonicalPath's form
// (never decoded: /a%2Fb is not /a/b). The gate's recorder and the
// sign-in-with-x check must both use it.
func PaidResource(host, escapedPath string) string {
	return strings.ToLower(host) + CanonicalPath(escapedPath)
}

func paidKey(addr, resource string) string {
	sum := sha256.Sum256([]byte(resource))
	if strings.HasPrefix(addr, "0x") {
		addr = strings.ToLower(addr) // EVM case is a checksum; Solana's base58 is case-sensitive
	}
	return "siwx/paid/" + addr + "/" + hex.EncodeToString(sum[:])
}

// Record notes that payer paid for resource, until TTL from now or the
// record's current end, whichever is later. payer is a settlement
// response's payer: a 0x address in any case, or a Solana address.
func (p PaidAccess) Record(ctx context.Context, payer, resource string) error {
	if payer == "" || resource == "" {
		return errors.New("recording paid access: payer and resource are required")
	}
	ttl := p.TTL
	if ttl <= 0 {
		ttl = DefaultPaidAccessTTL
	}
	if ttl > MaxPaidAccessTTL {
		return fmt.Errorf("recording paid access: TTL %s is over %s", ttl, MaxPaidAccessTTL)
	}
	if err := p.Claims.Record(ctx, paidKey(payer, resource), "paid", time.Now().Add(ttl)); err != nil {
		return fmt.Errorf("recording paid access: %w", err)
	}
	return nil
}

// Has reports whether addr paid for resource and the record still holds.
func (p PaidAccess) Has(ctx context.Context, addr, resource string) (bool, error) {
	st, err := p.Claims.Lookup(ctx, paidKey(addr, resource))
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking up paid access: %w", err)
	}
	return st.Settled, nil
}
