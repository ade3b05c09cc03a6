package evmfacilitator

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// Two resource servers of one payTo are handed the same authorization,
// each settling it through its own facilitator: ours, and another with its
// own relayer (an official middleware's). The other's transaction lands
// first and its settle answers success, so its server serves. Ours,
// already past its checks and sending, is outrun: its transaction
// reverts, and it answers nonce_already_used naming the other's
// transaction, as it answers a settle our own relayer's other transaction
// made. (Before: success naming the other's transaction, and both servers
// served one transfer.)
func TestOutrunByAnotherFacilitatorAnswersNonceUsed(t *testing.T) {
	outrun(t, DevKey(5))
}

// A status read (what a gate holding a payment whose settle ended unknown
// asks) answers a transfer as the settlement's own only when the settling
// facilitator sent it: the transaction it named, or one from its signers
// (our relayer for the embedded facilitator; the remote's /supported
// signers for a StatusReader). Relayed by another account (another
// facilitator settling it for another resource server, which served it),
// it is settled by another settlement: never for this caller, naming the
// transaction, duplicate_settlement. Without signers (a remote that
// publishes none) every sender's counts. (Before: done, and the gate
// served the payment a second time.)
func TestStatusOfATransferSentByAnotherIsSettledElsewhere(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	theirs := relayAuthorization(t, e.d, DevKey(5), p).TxHash.Hex()
	elsewhere := x402.SettlementStatus{State: x402.SettlementNever, Transaction: theirs, Reason: x402.ReasonDuplicateSettlement, Payer: crypto.PubkeyToAddress(payer.PublicKey).Hex()}
	done := elsewhere
	done.State, done.Reason = x402.SettlementDone, ""
	after := x402.SentSettlement{After: time.Now().Add(-time.Minute)}
	for _, sent := range []x402.SentSettlement{{}, after, {SettledOnly: true}} {
		if st, err := e.f.SentSettlementStatus(ctx, p, req, sent); err != nil || st != elsewhere {
			t.Fatalf("our facilitator, %+v: %+v, %v; want %+v", sent, st, err, elsewhere)
		}
	}
	reader := statusReader(t, e.d.Client())
	ours := Signers{Known: []common.Address{e.f.Relayer()}}
	theirSigner := crypto.PubkeyToAddress(DevKey(5).PublicKey)
	listsNow := func(a ...common.Address) func(context.Context) ([]common.Address, error) {
		return func(context.Context) ([]common.Address, error) { return a, nil }
	}
	for name, signers := range map[string]Signers{
		"a reader of a remote whose signer is our relayer": ours,
		"asked again, the sender still unlisted":           {Known: ours.Known, Again: listsNow(e.f.Relayer())},
	} {
		if st, err := reader.SentSettlementStatusBy(ctx, p, req, after, signers); err != nil || st != elsewhere {
			t.Fatalf("%s: %+v, %v; want %+v", name, st, err, elsewhere)
		}
	}
	// Signers that cannot be asked again leave the outcome unknown: the
	// sender may be the remote's new relayer.
	down := Signers{Known: ours.Known, Again: func(context.Context) ([]common.Address, error) { return nil, errors.New("remote down") }}
	var unknown *x402.UnknownOutcomeError
	if st, err := reader.SentSettlementStatusBy(ctx, p, req, after, down); !errors.As(err, &unknown) || st.State != x402.SettlementUndecided {
		t.Fatalf("signers that cannot be asked again: %+v, %v; want an unknown outcome", st, err)
	}
	// Signers not known now (a remote that cannot be read since a
	// restart) leave those recorded with the attempt to judge by, and the
	// sender is asked about again. (Before: all senders counted, and the
	// other facilitator's transfer was served as the gate's own.)
	recordedOurs := after
	recordedOurs.Signers = []string{e.f.Relayer().Hex()}
	unread := Signers{Again: down.Again}
	if st, err := reader.SentSettlementStatusBy(ctx, p, req, recordedOurs, unread); !errors.As(err, &unknown) || st.State != x402.SettlementUndecided {
		t.Fatalf("signers not known now and that cannot be asked again, others recorded: %+v, %v; want an unknown outcome", st, err)
	}
	if st, err := reader.SentSettlementStatusBy(ctx, p, req, recordedOurs, Signers{Again: listsNow(e.f.Relayer())}); err != nil || st != elsewhere {
		t.Fatalf("signers not known now, others recorded and listed again: %+v, %v; want %+v", st, err, elsewhere)
	}
	recorded := after
	recorded.Signers = []string{strings.ToLower(theirSigner.Hex())}
	for name, c := range map[string]struct {
		sent    x402.SentSettlement
		signers Signers
	}{
		"the sender among the signers":     {after, Signers{Known: []common.Address{e.f.Relayer(), theirSigner}}},
		"the transaction the remote named": {x402.SentSettlement{Transaction: theirs, After: after.After}, ours},
		"no signers known":                 {after, Signers{}},
		// (Before: only the signers of now counted, and a relayer key
		// changed while the payment was held refused its charged buyer.)
		"the sender among the signers recorded with the attempt": {recorded, ours},
		// (Before: a remote's signers were taken as remembered, up to 5
		// minutes old, and its new relayer's transfer was another's.)
		"the sender listed when the signers are asked again": {after, Signers{Known: ours.Known, Again: listsNow(e.f.Relayer(), theirSigner)}},
		"asked again, no signers listed any more":            {after, Signers{Known: ours.Known, Again: listsNow()}},
	} {
		if st, err := reader.SentSettlementStatusBy(ctx, p, req, c.sent, c.signers); err != nil || st != done {
			t.Fatalf("%s: %+v, %v; want %+v", name, st, err, done)
		}
	}
	if st, err := reader.SettlementStatus(ctx, p, req); err != nil || st != done {
		t.Fatalf("a reader without signers: %+v, %v; want %+v", st, err, done)
	}
}

// readsCounted is a Chain that counts the transactions read by hash.
type readsCounted struct {
	Chain
	mu    sync.Mutex
	reads map[common.Hash]int
}

func (c *readsCounted) TransactionByHash(ctx context.Context, h common.Hash) (*types.Transaction, bool, error) {
	c.mu.Lock()
	c.reads[h]++
	c.mu.Unlock()
	return c.Chain.TransactionByHash(ctx, h)
}

// A status read that finds the transaction that used the nonce reads it
// once: for its call (which authorization it executed) and for its sender
// (whose settlement it is) alike. (Before: twice, once for each.)
func TestStatusReadsTheNonceUsersTransactionOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	theirs := relayAuthorization(t, e.d, DevKey(5), p).TxHash
	ours := Signers{Known: []common.Address{e.f.Relayer()}}
	for _, sent := range []x402.SentSettlement{{After: time.Now().Add(-time.Minute)}, {}} {
		chain := &readsCounted{Chain: e.d.Client(), reads: map[common.Hash]int{}}
		reader := statusReader(t, chain)
		st, err := reader.SentSettlementStatusBy(ctx, p, req, sent, ours)
		if err != nil || st.Reason != x402.ReasonDuplicateSettlement {
			t.Fatalf("%+v: %+v, %v; want settled elsewhere", sent, st, err)
		}
		if n := chain.reads[theirs]; n > 1 {
			t.Errorf("%+v: the transaction that used the nonce was read %d times, want at most once", sent, n)
		}
	}
}
