package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
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

// cardUnavailable names what is unavailable to a buyer whose answer was
// withheld because the card could not be read: the keys, not the
// verification service, which answered.
const cardUnavailable = "agent card with the verification service's receipt keys"

// newReceiptKeys returns the keys of the card at cardURL, read with client
// within timeout (verify_response's verifier_timeout). A card_url that
// answers no card is logged to logger once.
func newReceiptKeys(cardURL string, client *http.Client, timeout time.Duration, logger *zap.Logger) *receiptKeys {
	named := "(unparsable)"
	if u, err := url.Parse(cardURL); err == nil {
		named = withoutUserinfo(u)
	}
	return &receiptKeys{url: cardURL, named: named, client: client, timeout: timeout, logger: logger}
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
	named   string // url for the log, without its user information
	client  *http.Client
	timeout time.Duration // of one read of the card
	logger  *zap.Logger   // nil: nothing logged

	mu      sync.Mutex // guards the fields below
	keys    receipt.KeySet
	fetched time.Time // when keys were read; zero: never
	tried   time.Time // when the last read ended
	err     error     // its error (nil: it read keys)
	// reading is closed when the running read ends; nil while none runs.
	// One read at a time, on its own deadline: the calls waiting for it
	// give up at theirs, and the read goes on for the next call.
	reading chan struct{}
	// noCardLogged: the card_url answering no card has been logged.
	noCardLogged bool
}

// verify checks the signature of a verification receipt, raw as the
// verification service sent it, against the card's keys: those cached
// while they are younger than cardMaxAge and hold the receipt's key
// version, else those of a fresh read of the card (refresh). A card that
// cannot be read is an error as a bad signature is: the receipt is not
// trusted. Errors are *apierr.Error, ready for on_error.
func (k *receiptKeys) verify(ctx context.Context, raw []byte) error {
	k.mu.Lock()
	ks, fresh := k.keys, !k.fetched.IsZero() && time.Since(k.fetched) < cardMaxAge
	k.mu.Unlock()
	if fresh {
		err := receipt.VerifyReceipt(raw, ks, receipt.ContextVerify)
		var unknown *receipt.NoKeyError
		if !errors.As(err, &unknown) {
			return untrusted(err)
		}
	}
	ks, err := k.refresh(ctx)
	if err != nil {
		return apierr.Unavailable(cardUnavailable, 2, fmt.Errorf("reading the agent card: %w", err))
	}
	return untrusted(receipt.VerifyReceipt(raw, ks, receipt.ContextVerify))
}

// untrusted is the refusal of a receipt whose signature does not hold
// (nil for nil).
func untrusted(err error) error {
	if err == nil {
		return nil
	}
	return apierr.Unavailable("verification service", 2, fmt.Errorf("the receipt does not verify against the agent card's keys: %w", err))
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
// done. A card_url that answers, but with no card (a 4xx other than 408
// and 429, or a document that is not a card), is a misconfiguration no
// retry mends: it is logged at error level once, naming the option.
func (k *receiptKeys) read(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
	defer cancel()
	card, err := receipt.FetchCard(ctx, k.client, k.url)
	var ks receipt.KeySet
	var noCard bool
	if err == nil {
		ks, err = receipt.KeysFromCard(card)
		noCard = err != nil
	} else {
		var se *receipt.CardStatusError
		noCard = errors.As(err, &se) && se.Status >= 400 && se.Status < 500 &&
			se.Status != http.StatusRequestTimeout && se.Status != http.StatusTooManyRequests
	}
	k.mu.Lock()
	k.tried, k.err, k.reading = time.Now(), err, nil
	if err == nil {
		k.keys, k.fetched = ks, k.tried
	}
	logIt := noCard && !k.noCardLogged && k.logger != nil
	k.noCardLogged = k.noCardLogged || logIt
	k.mu.Unlock()
	close(done)
	if logIt {
		k.logger.Error("verify_response: card_url answers no agent card, so no receipt can be checked and every answer is unverifiable (on_error decides what the buyer gets); "+
			"set card_url to the card certd serves (with make run http://127.0.0.1:8082/.well-known/agent-card.json): "+
			"verifierd does not serve it, and card_url defaults to <verifier_url>/.well-known/agent-card.json",
			zap.String("card_url", k.named), zap.Error(err))
	}
}
