package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/aovhq/aov/receipt"
)

// How verify_response keeps the verification service's public keys.
const (
	// cardRefetchEvery is the least time between two fetches of the
	// agent card: a receipt naming a key version the keys lack (a key
	// rotated since they were read) has the card read again at once, but
	// a verification service that names unknown versions on purpose, or a
	// card server that fails, costs one fetch a second, not one per
	// answer.
	cardRefetchEvery = time.Second
	// cardMaxAge: keys read longer ago are read again before they are
	// used, so a key the card has since marked compromised stops
	// verifying receipts within it.
	cardMaxAge = 5 * time.Minute
)

// newReceiptKeys returns the keys of the card at url, read with client.
func newReceiptKeys(url string, client *http.Client) *receiptKeys {
	return &receiptKeys{url: url, client: client, fetching: make(chan struct{}, 1)}
}

// receiptKeys are the verification service's public keys, read from its
// agent card as a buyer reads them (receipt.FetchCard, receipt.KeysFromCard)
// and cached. verify_response checks every receipt's signature against
// them before it attaches the receipt or records a pass the gate settles
// on: the hop to the verification service is the operator's, but what
// comes back over it is a claim until its signature holds (a proxy
// rewriting "fail" to "pass" would otherwise get the buyer charged, and
// handed a receipt that does not verify).
type receiptKeys struct {
	url    string // the card's
	client *http.Client

	// fetching holds a token while a fetch runs: one at a time, and a
	// call waiting for it gives up at its own deadline.
	fetching chan struct{}

	mu      sync.Mutex // guards the fields below
	keys    receipt.KeySet
	fetched time.Time // when keys were read; zero: never
	tried   time.Time // the last fetch
	err     error     // its error (nil: it read keys)
}

// verify checks the signature of a verification receipt, raw as the
// verification service sent it, against the card's keys: those cached
// while they are younger than cardMaxAge and hold the receipt's key
// version, else those of a fresh read of the card (refresh). A card that
// cannot be read is an error as a bad signature is: the receipt is not
// trusted.
func (k *receiptKeys) verify(ctx context.Context, raw []byte) error {
	k.mu.Lock()
	ks, fresh := k.keys, !k.fetched.IsZero() && time.Since(k.fetched) < cardMaxAge
	k.mu.Unlock()
	if fresh {
		err := receipt.VerifyReceipt(raw, ks, receipt.ContextVerify)
		var unknown *receipt.NoKeyError
		if !errors.As(err, &unknown) {
			return err
		}
	}
	ks, err := k.refresh(ctx)
	if err != nil {
		return err
	}
	return receipt.VerifyReceipt(raw, ks, receipt.ContextVerify)
}

// refresh reads the card, unless it was read (or tried) less than
// cardRefetchEvery ago: then that read's keys, or its error, are the
// answer.
func (k *receiptKeys) refresh(ctx context.Context) (receipt.KeySet, error) {
	select {
	case k.fetching <- struct{}{}:
	case <-ctx.Done():
		return receipt.KeySet{}, ctx.Err()
	}
	defer func() { <-k.fetching }()
	k.mu.Lock()
	if !k.tried.IsZero() && time.Since(k.tried) < cardRefetchEvery {
		defer k.mu.Unlock()
		return k.keys, k.err
	}
	k.mu.Unlock()
	card, err := receipt.FetchCard(ctx, k.client, k.url)
	var ks receipt.KeySet
	if err == nil {
		ks, err = receipt.KeysFromCard(card)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.tried, k.err = time.Now(), err
	if err != nil {
		return receipt.KeySet{}, err
	}
	k.keys, k.fetched = ks, k.tried
	return ks, nil
}
