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

// newReceiptKeys returns the keys of the card at url, read with client
// within timeout (verify_response's verifier_timeout).
func newReceiptKeys(url string, client *http.Client, timeout time.Duration) *receiptKeys {
	return &receiptKeys{url: url, client: client, timeout: timeout}
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
	url     string // the card's
	client  *http.Client
	timeout time.Duration // of one read of the card

	mu      sync.Mutex // guards the fields below
	keys    receipt.KeySet
	fetched time.Time // when keys were read; zero: never
	tried   time.Time // when the last read ended
	err     error     // its error (nil: it read keys)
	// reading is closed when the running read ends; nil while none runs.
	// One read at a time, on its own deadline: the calls waiting for it
	// give up at theirs, and the read goes on for the next call.
	reading chan struct{}
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

// refresh returns the keys of the last read of the card, or its error,
// when it ended less than cardRefetchEvery ago; otherwise those of a new
// read, started unless one runs. The read runs on its own deadline, so a
// call that gives up (ctx: its own deadline, or its client gone) never
// leaves its deadline behind as the card's error for the calls after it.
func (k *receiptKeys) refresh(ctx context.Context) (receipt.KeySet, error) {
	k.mu.Lock()
	if k.reading == nil && (k.tried.IsZero() || time.Since(k.tried) >= cardRefetchEvery) {
		k.reading = make(chan struct{})
		go k.read(k.reading)
	}
	reading := k.reading
	k.mu.Unlock()
	if reading != nil {
		select {
		case <-reading:
		case <-ctx.Done():
			return receipt.KeySet{}, ctx.Err()
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return receipt.KeySet{}, k.err
	}
	return k.keys, nil
}

// read reads the card within k.timeout, keeps what it read, and closes
// done.
func (k *receiptKeys) read(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
	defer cancel()
	card, err := receipt.FetchCard(ctx, k.client, k.url)
	var ks receipt.KeySet
	if err == nil {
		ks, err = receipt.KeysFromCard(card)
	}
	k.mu.Lock()
	k.tried, k.err, k.reading = time.Now(), err, nil
	if err == nil {
		k.keys, k.fetched = ks, k.tried
	}
	k.mu.Unlock()
	close(done)
}
