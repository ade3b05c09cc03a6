package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/ethereum/go-ethereum/common"
	"go.uber.org/zap"

	"github.com/aovhq/aov/internal/secretopt"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// Unknown settlements with a remote facilitator.
//
// The x402 facilitator API has no status call, so when a remote
// facilitator's /settle times out after sending, it cannot be asked later
// whether the money moved. The gate reads the chain itself instead, from
// the endpoints named by `rpc <network> <rpc-url>` in `facilitator http`:
// for EIP-3009 (EVM networks) the token's authorizationState(authorizer,
// nonce), judged by evmfacilitator.StatusReader exactly as the embedded
// facilitator judges it. Used is not proof by itself (the payer can cancel
// the nonce or spend it on another authorization): the transaction that
// used it is found by the token's AuthorizationUsed/AuthorizationCanceled
// log, searched from the settlement attempt on (SentSettlement.After), and
// the transfer happened only when it carries the authorization's Transfer
// to payTo and its call of the token executed this very authorization
// (another of the nonce, in an overlapping window, logs the same
// Transfer); the nonce spent otherwise: it never can; used by a
// transaction that cannot be found or read, or whose call is not the
// token's own: still undecided. Unused with validBefore
// reached by the head block's time: it never can; otherwise undecided.
// Each check is bounded by the facilitator's timeout. Nothing is ever sent.
//
// An EIP-3009 authorization is a bearer instrument: the buyer can hand the
// same one to another resource server of the same payTo (an official x402
// middleware with its own facilitator), whose facilitator settles it and
// whose server serves it. So a transfer found on chain is this
// settlement's only when the remote sent it: the transaction it named, or
// one sent from an address its GET /supported lists as a signer for
// "eip155:*" or the network (remoteSigners). Sent by anyone else, it is
// settled by another settlement, and the gate releases the payment and
// serves nothing. A remote that publishes no signers for the network (or
// whose /supported was never answered) leaves every sender's transfer
// counted as its own, as before signers were read. The signers that count
// are those remembered now, those recorded with the held payment when its
// attempt was made (heldRecord.Signers), and, for a sender in neither,
// those the remote lists when asked again (HTTPFacilitator.signers): a
// remote that changed its relayer within the 5 minutes its list is
// remembered sends from one the gate has not seen yet.
//
// On Solana the transaction is named by its first signature, the
// facilitator's own fee-payer signature, which only the facilitator makes.
// When the facilitator named it in its settlement_pending answer (ours
// does), the gate polls it with getSignatureStatuses on the Solana `rpc`
// (svmfacilitator.StatusReader, after checking it is the fee payer's
// signature over the payment's own message); when the reply was lost
// whole, the reader searches the chain for the payment's own message among
// the transactions of its source token account, no further back than the
// settlement attempt (svmfacilitator's status_search.go, bounded; a bound
// hit leaves the outcome undecided). Either way the transaction found
// landed is the attempt's only if it landed after the attempt began
// (SentSettlement.After; svmfacilitator's attempt.go): one older is a
// replay's original, settled by another settlement. The embedded Solana
// facilitator (svm) signs the transaction's id again from its key and
// answers itself, also after a restart.

// remoteStatus is what HTTPFacilitator reads settlement outcomes with.
type remoteStatus struct {
	readers map[string]*evmfacilitator.StatusReader // EVM networks, by CAIP-2 id
	solana  map[string]*svmfacilitator.StatusReader // Solana networks
	clients []*settlementChain
	timeout time.Duration
	signers *remoteSigners
}

// remoteSigners remembers a remote facilitator's GET /supported answer,
// whose signers are the addresses its settlements are sent from: asked
// again multiSupportedTTL after an answer, multiRetryMax after a failure,
// the last answer kept meanwhile (a remote down does not make its own
// transfers another's).
type remoteSigners struct {
	mu    sync.Mutex
	s     x402.SupportedResponse
	known bool
	next  time.Time // when to ask again
	// learning is set while rememberedSigners's background ask runs.
	learning bool
}

// evmSigners returns the addresses m's remote settles network's payments
// from (evmSignersOf its remembered /supported, asked within ask's bound
// when due), nil when it is not known.
func (m *HTTPFacilitator) evmSigners(ctx context.Context, network string) []common.Address {
	r := m.status.signers
	r.mu.Lock()
	s, known, due := r.s, r.known, !now().Before(r.next)
	r.mu.Unlock()
	if due {
		if got, err := m.askSigners(ctx); err == nil {
			s, known = got, true
		}
	}
	if !known {
		return nil
	}
	return evmSignersOf(s, network)
}

// askSigners asks the remote's GET /supported now (within ask's bound)
// and remembers the answer, or when to ask again after a failure.
func (m *HTTPFacilitator) askSigners(ctx context.Context) (x402.SupportedResponse, error) {
	r := m.status.signers
	askCtx, cancel, _ := ask(ctx)
	got, err := m.f.Supported(askCtx)
	cancel()
	r.mu.Lock()
	if err == nil {
		r.s, r.known, r.next = got, true, now().Add(multiSupportedTTL)
	} else {
		r.next = now().Add(multiRetryMax)
	}
	r.mu.Unlock()
	if err != nil {
		m.logger.Warn("reading the facilitator's signers (GET /supported) to judge a settlement's transaction", zap.Error(err))
	}
	for key, list := range got.Signers {
		if len(list) > maxSigners {
			m.logger.Warn("the facilitator's GET /supported lists more signers than the gate reads: taken as listing none, so a transfer of a held payment counts as the facilitator's whoever sent it",
				zap.String("signers", key), zap.Int("listed", len(list)), zap.Int("max", maxSigners))
			break
		}
	}
	return got, err
}

// signers is whose transfers count as the remote's on network: the
// signers remembered (evmSigners) and, for a sender they do not list,
// those its /supported lists when asked again, past what is remembered
// (askSigners, once per status read, within its deadline).
func (m *HTTPFacilitator) signers(ctx context.Context, network string) evmfacilitator.Signers {
	return evmfacilitator.Signers{Known: m.evmSigners(ctx, network), Again: func(ctx context.Context) ([]common.Address, error) {
		s, err := m.askSigners(ctx)
		if err != nil {
			return nil, err
		}
		return evmSignersOf(s, network), nil
	}}
}

// maxSigners bounds the signers a facilitator's /supported may list under
// one key ("eip155:*", a network): a
// facilitator sends from a few relayers, and the list is read on every
// status read of a held payment and kept with its record. A longer list
// (up to 1 MiB of addresses, some 23,000) cost a quadratic deduplication
// of CPU on every read and a megabyte per held record; it is taken as
// listing none (evmSignersOf), with a warning (askSigners).
const maxSigners = 64

// evmSignersOf is the one reading of the EVM signers of a /supported
// answer for network: the addresses listed under "eip155:*" and under the
// network itself; nil when it lists none, or more than maxSigners under
// either.
func evmSignersOf(s x402.SupportedResponse, network string) []common.Address {
	keys := []string{"eip155:*", network}
	if len(s.Signers[keys[0]]) > maxSigners || len(s.Signers[keys[1]]) > maxSigners {
		return nil
	}
	var out []common.Address
	for _, key := range keys {
		for _, a := range s.Signers[key] {
			if common.IsHexAddress(a) && !slices.Contains(out, common.HexToAddress(a)) {
				out = append(out, common.HexToAddress(a))
			}
		}
	}
	return out
}

// heldSigners is what a held record keeps of whose EVM transfers are the
// gate's facilitator f's own on network (heldRecord.Signers), hex; nil on
// a network that is not EVM. It is written with the claim (claimPaid),
// before the settlement is asked for, with asking false: the signers
// known without asking anyone (knownSigners), so a gateway killed while
// its facilitator sends leaves them with the payment. When the attempt
// ended unknown (holdUnknown), asking adds those a remote's /supported
// lists when it is due (evmSigners; a multi's, every member's), asked
// with the request's context cut loose, within ask's bound, so that a
// buyer who left does not count as the remote's failure.
func heldSigners(ctx context.Context, f x402.Facilitator, network string, asking bool) []string {
	if !x402.IsEVM(network) {
		return nil
	}
	a := knownSigners(ctx, f, network)
	if asking {
		ctx = context.WithoutCancel(ctx)
		switch f := f.(type) {
		case *HTTPFacilitator:
			a = appendNew(a, f.evmSigners(ctx, network)...)
		case *MultiFacilitator:
			a = appendNew(a, f.evmSigners(ctx, network).Known...)
		}
	}
	var out []string
	for _, x := range a {
		out = append(out, x.Hex())
	}
	return out
}

// knownSigners returns f's signers on network that no remote is asked
// for: the embedded evm facilitator's relayer, a remote's as remembered
// (rememberedSigners), a multi's as memberSigners reads them (the union
// of every member's that settles network, nil when one of them lists
// none or has not been read: any sender's) from what the multi remembers
// of its remote members, another module's by its own /supported (within
// ask's bound). The paid path asks it of every claim: it never waits on a
// remote's /supported.
func knownSigners(ctx context.Context, f x402.Facilitator, network string) []common.Address {
	switch f := f.(type) {
	case *EVMFacilitator:
		return []common.Address{f.f.Relayer()}
	case rememberingSigners:
		return f.rememberedSigners(network)
	case *MultiFacilitator:
		a, _ := f.memberSigners(ctx, network, signersFromMemory)
		return a
	default:
		askCtx, cancel, _ := ask(context.WithoutCancel(ctx))
		s, err := f.Supported(askCtx)
		cancel()
		if err != nil {
			return nil
		}
		return evmSignersOf(s, network)
	}
}

// rememberingSigners is a remote facilitator, HTTPFacilitator or a
// module built on it: its signers are what it remembers of its remote.
type rememberingSigners interface {
	rememberedSigners(network string) []common.Address
}

// rememberedSigners returns the remote's signers on network as last read
// (nil when it was never read), asking nothing. When they are wanted
// unread, its /supported is asked in the background (within ask's bound;
// one ask at a time, none before a failed one's retry is due), so that
// the claims after it keep them: a claim written before any answer keeps
// none of the remote's, and a remote that changes its relayer before that
// payment is resolved sends from one neither the record nor its
// /supported then lists.
func (m *HTTPFacilitator) rememberedSigners(network string) []common.Address {
	r := m.status.signers
	r.mu.Lock()
	s, known, learn := r.s, r.known, !r.known && !r.learning && !now().Before(r.next)
	r.learning = r.learning || learn
	r.mu.Unlock()
	if learn {
		go func() {
			m.askSigners(context.Background())
			r.mu.Lock()
			r.learning = false
			r.mu.Unlock()
		}()
	}
	if !known {
		return nil
	}
	return evmSignersOf(s, network)
}

// appendNew appends to a the addresses of b it does not hold yet.
func appendNew(a []common.Address, b ...common.Address) []common.Address {
	for _, x := range b {
		if !slices.Contains(a, x) {
			a = append(a, x)
		}
	}
	return a
}

// provisionStatus dials the rpc endpoints (an http(s) dial makes no
// request; the chain is first asked when an outcome is unknown; a ws(s)
// one connects within the facilitator's timeout).
func (m *HTTPFacilitator) provisionStatus(repl *caddy.Replacer, log *zap.Logger) error {
	m.status = remoteStatus{readers: map[string]*evmfacilitator.StatusReader{}, solana: map[string]*svmfacilitator.StatusReader{},
		timeout: time.Duration(m.Timeout), signers: &remoteSigners{}}
	if m.status.timeout <= 0 {
		m.status.timeout = x402.DefaultFacilitatorTimeout
	}
	for name, raw := range m.RPC {
		network, err := x402.ResolveNetwork(name)
		if err != nil {
			return fmt.Errorf("http facilitator: rpc %s: %v", name, err)
		}
		_, dupEVM := m.status.readers[network]
		_, dupSVM := m.status.solana[network]
		if dupEVM || dupSVM {
			return fmt.Errorf("http facilitator: rpc %s: network %s named twice", name, network)
		}
		url := repl.ReplaceKnown(raw, "")
		secretopt.WarnIfURLCredentials(log, "rpc "+name, raw, url)
		if x402.IsSolana(network) {
			r, err := svmfacilitator.NewStatusReader(&svmfacilitator.RPC{URL: url}, network)
			if err != nil {
				m.Cleanup()
				return err
			}
			m.status.solana[network] = r
			continue
		}
		if !x402.IsEVM(network) {
			return fmt.Errorf("http facilitator: rpc %s: settlement outcomes are read on EVM and Solana chains only", name)
		}
		c, err := dialSettlementChain(context.Background(), url, m.status.timeout)
		if err != nil {
			m.Cleanup()
			return fmt.Errorf("http facilitator: rpc %s: %v", name, secretopt.Scrub(err, url))
		}
		m.status.clients = append(m.status.clients, c)
		r, err := evmfacilitator.NewStatusReader(c, network)
		if err != nil {
			m.Cleanup()
			return err
		}
		m.status.readers[network] = r
	}
	return nil
}

// Cleanup closes the rpc connections, and the idle connections to the
// facilitator, once the config's requests in flight are done (a gate may
// be reading a settlement's outcome through them, or settling). The
// facilitator's would otherwise stay open past a reload, a pool of
// connections per config loaded, until their transport's idle timeout.
func (m *HTTPFacilitator) Cleanup() error {
	clients := m.status.clients
	m.status.clients = nil
	f := m.f
	return m.uses.AfterRequests(func() error {
		for _, c := range clients {
			c.Close()
		}
		if f != nil {
			f.CloseIdleConnections()
		}
		return nil
	})
}

// SettlementStatus implements x402.SettlementChecker from the chain of
// req's network, when an rpc endpoint is configured for it.
func (m *HTTPFacilitator) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	return m.SentSettlementStatus(ctx, p, req, x402.SentSettlement{})
}

// SentSettlementStatus implements x402.SentSettlementChecker: by the
// transaction the facilitator named or, when it named none, by the
// payment's transaction found on chain, no further back than the attempt;
// on an EVM chain, a transfer counts as this settlement's when the remote
// named it or one of its signers sent it (signers).
func (m *HTTPFacilitator) SentSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error) {
	return m.sentSettlementStatusBy(ctx, p, req, sent, m.signers)
}

// sentSettlementStatusBy implements signedStatusReader: SentSettlementStatus
// with an EVM transfer counted as this settlement's when signers (asked
// only for an EVM network with an rpc endpoint) list its sender.
func (m *HTTPFacilitator) sentSettlementStatusBy(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement, signers func(context.Context, string) evmfacilitator.Signers) (x402.SettlementStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, m.status.timeout)
	defer cancel()
	if r := m.status.readers[req.Network]; r != nil {
		return r.SentSettlementStatusBy(ctx, p, req, sent, signers(ctx, req.Network))
	}
	if r := m.status.solana[req.Network]; r != nil {
		return r.SentSettlementStatus(ctx, p, req, sent)
	}
	return x402.SettlementStatus{}, fmt.Errorf("no rpc endpoint for %s is configured on the http facilitator (rpc <network> <url>); the settlement stays pending", req.Network)
}

// readsSettlements implements settlementReader: the networks with an rpc
// endpoint.
func (m *HTTPFacilitator) readsSettlements(_ context.Context, offer x402.PaymentRequirements) bool {
	return m.status.readers[offer.Network] != nil || m.status.solana[offer.Network] != nil
}

// readsSettlements implements settlementReader by configuration: whether
// a member reads offer's settlements (memberReads), whether or not it can
// be reached now. A member briefly down leaves the payment
// settlement_pending until it answers. (Asked through pick, a remote
// member with rpc configured but briefly down read as "cannot read the
// chain", and the background pass marked a resolvable payment
// unresolvable for 7 days.)
func (m *MultiFacilitator) readsSettlements(ctx context.Context, offer x402.PaymentRequirements) bool {
	for i := range m.fs {
		if m.memberReads(ctx, i, offer) {
			return true
		}
	}
	return false
}

// memberReads is the one rule for whether member i reads offer's
// settlements: a remote one (settlementReader) with an rpc endpoint for
// the network; an embedded one that settles the network, by its own
// answer, never a remote's, and for Solana only the payments whose fee
// payer it manages (managesFeePayer), as pick sends it only those: it
// answers any other's status with "the fee payer is not this
// facilitator's", for ever.
func (m *MultiFacilitator) memberReads(ctx context.Context, i int, offer x402.PaymentRequirements) bool {
	f := m.fs[i]
	if sr, ok := f.(settlementReader); ok {
		return sr.readsSettlements(ctx, offer)
	}
	if _, ok := f.(x402.SettlementChecker); !ok {
		return false
	}
	s, err := m.kinds(ctx, i)
	if err != nil {
		return false
	}
	for _, k := range s.Kinds {
		if settlesKind(k, offer) && managesFeePayer(k, offer) {
			return true
		}
	}
	return false
}

// statusMember is the member asked for req's settlement status: the one
// that settles it (pick) when it reads req's chain, else the first member
// that does (memberReads, as readsSettlements counts the payment
// readable), else pick's, whose answer says why it cannot tell. (Asked
// only through pick, a remote member without rpc listed first answered
// "no rpc endpoint" for ever although an embedded member read the chain,
// and the charged buyer was never served.) sibling tells that another
// member may have sent the payment (mayBeSiblings), so the one asked reads
// it as a sibling's (siblingReader).
func (m *MultiFacilitator) statusMember(ctx context.Context, req x402.PaymentRequirements) (f x402.Facilitator, sibling bool, err error) {
	picked, err := m.pickIndex(ctx, req)
	reader := -1
	for i := range m.fs {
		if !m.memberReads(ctx, i, req) {
			continue
		}
		if i == picked {
			return m.fs[i], m.mayBeSiblings(picked, i), nil
		}
		if reader < 0 {
			reader = i
		}
	}
	switch {
	case reader >= 0:
		return m.fs[reader], m.mayBeSiblings(picked, reader), nil
	case picked >= 0:
		return m.fs[picked], m.mayBeSiblings(picked, picked), nil
	}
	return nil, false, err
}

// mayBeSiblings is the one rule for whether member asked, reading a
// payment's status, may be reading a send another member made: pick's
// member now (picked, -1 when pick failed) is another, or the multi has a
// remote (http) member. pick's member now need not be the one that sent:
// a remote that sent a payment under the fee payer an embedded svm member
// also manages, and is down since (its /supported no longer remembered,
// or a restart with it down), leaves pick at the svm member, and read as
// its own, the landed send it has no record of would be "settled by
// another settlement" and the charged buyer refused. Embedded members
// answer /supported from their configuration, so among them alone, within
// one load, pick's member now is the one that sent; an EIP-3009 payment
// is read with every member's signers whatever this tells
// (signedStatusReader), as a load that reorders the members moves pick.
func (m *MultiFacilitator) mayBeSiblings(picked, asked int) bool {
	return picked >= 0 && picked != asked || m.hasRemote()
}

// hasRemote reports whether a member of m is a remote (http) facilitator.
func (m *MultiFacilitator) hasRemote() bool {
	for _, f := range m.fs {
		if _, ok := f.(*HTTPFacilitator); ok {
			return true
		}
	}
	return false
}

// siblingReader is a member that reads the outcome of a payment another
// member of its multi sent: the embedded svm facilitator, which reads a
// payment whose fee payer it manages and, when a remote member with the
// same fee payer sent it, would otherwise answer a landed send "settled by
// another settlement" (it holds no record of it, or a store the two share
// holds the remote's, marked answered when the reply now lost went out),
// and the charged buyer would be refused duplicate_settlement.
type siblingReader interface {
	siblingSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error)
}

// signedStatusReader is a member that reads an EIP-3009 payment's status
// counting a transfer as the settlement's only when the transaction was
// sent from one of the signers signers(ctx, network) returns (nil: any):
// the embedded evm facilitator, whose own are its relayer alone, and a
// remote one, whose own are its /supported signers. In a multi it is
// always asked with every member's signers (MultiFacilitator.evmSigners):
// any of the gate's own facilitators' relayers is the gate's, whichever
// member pick chooses now. (Asked with its own alone unless a remote
// member was configured, the member put first by a reload or restart
// after another member sent a held payment took that send for another
// settlement's, and the charged buyer was refused.)
type signedStatusReader interface {
	sentSettlementStatusBy(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement, signers func(context.Context, string) evmfacilitator.Signers) (x402.SettlementStatus, error)
}

// evmSigners returns the signers of every member that settles network,
// by their remembered /supported (kinds): Known nil (any sender counts)
// when a member's cannot be read or lists none for it. With a remote
// member, Again asks the remote members again (askSigners) and the
// others as remembered.
func (m *MultiFacilitator) evmSigners(ctx context.Context, network string) evmfacilitator.Signers {
	known, _ := m.memberSigners(ctx, network, signersWhenDue)
	if !m.hasRemote() {
		return evmfacilitator.Signers{Known: known}
	}
	return evmfacilitator.Signers{Known: known, Again: func(ctx context.Context) ([]common.Address, error) {
		return m.memberSigners(ctx, network, signersAgain)
	}}
}

// How memberSigners reads a member's /supported: as remembered, asking
// no remote (the paid path's claim); as kinds reads it (asked when due);
// or asking the remote members again past what is remembered.
const (
	signersFromMemory = iota
	signersWhenDue
	signersAgain
)

// memberSigners is the union of the signers of every member that settles
// network, nil when one's cannot be read or lists none, each member's
// /supported read as how says; signersAgain fails when a remote member
// cannot be asked, signersFromMemory when one was never read.
func (m *MultiFacilitator) memberSigners(ctx context.Context, network string, how int) ([]common.Address, error) {
	var out []common.Address
	for i := range m.fs {
		read := m.kinds
		if how == signersFromMemory {
			read = m.remembered
		}
		s, err := read(ctx, i)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(s.Kinds, func(k x402.SupportedKind) bool { return k.Network == network }) {
			continue
		}
		if h, ok := m.fs[i].(*HTTPFacilitator); ok && how == signersAgain {
			if s, err = h.askSigners(ctx); err != nil {
				return nil, err
			}
		}
		a := evmSignersOf(s, network)
		if a == nil {
			return nil, nil
		}
		out = appendNew(out, a...)
	}
	return out, nil
}

// SettlementStatus implements x402.SettlementChecker through the
// facilitator that settles req's network, when it can tell.
func (m *MultiFacilitator) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	return m.SentSettlementStatus(ctx, p, req, x402.SentSettlement{})
}

// SentSettlementStatus implements x402.SentSettlementChecker through the
// member that reads req's chain (statusMember), as the reader of a
// sibling's send when another member may have sent it (mayBeSiblings,
// siblingReader).
func (m *MultiFacilitator) SentSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error) {
	f, sibling, err := m.statusMember(ctx, req)
	if f == nil {
		if err == nil {
			err = errors.New("no facilitator settles " + req.Network)
		}
		return x402.SettlementStatus{}, err
	}
	// Never ask the member picked on a context already spent: its
	// failure would read as the member's.
	if err := ctx.Err(); err != nil {
		return x402.SettlementStatus{}, fmt.Errorf("no time left to ask for the settlement's status: %w", err)
	}
	if sr, ok := f.(siblingReader); ok && sibling {
		return sr.siblingSettlementStatus(ctx, p, req, sent)
	}
	if sr, ok := f.(signedStatusReader); ok {
		return sr.sentSettlementStatusBy(ctx, p, req, sent, m.evmSigners)
	}
	if ssc, ok := f.(x402.SentSettlementChecker); ok {
		return ssc.SentSettlementStatus(ctx, p, req, sent)
	}
	sc, ok := f.(x402.SettlementChecker)
	if !ok {
		return x402.SettlementStatus{}, fmt.Errorf("the %s facilitator cannot tell a settlement's outcome", req.Network)
	}
	return sc.SettlementStatus(ctx, p, req)
}

// SettlementStatus lets the gate resolve unknown settlements of the
// embedded Solana facilitator: it polls the signature of the transaction it
// sent, signed again from its key when it does not remember it (after a
// restart).
func (m *SVMFacilitator) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	return m.f.SettlementStatus(ctx, p, req)
}

// siblingSettlementStatus implements siblingReader: the chain's word on
// the transaction, whoever's record of it the store holds, unless this
// facilitator sent it itself
// (svmfacilitator.Facilitator.PeerSettlementStatus); landed before the
// attempt began (sent.After), it is another settlement's.
func (m *SVMFacilitator) siblingSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error) {
	return m.f.PeerSettlementStatus(ctx, p, req, sent.After)
}

// SentSettlementStatus lets the gate resolve unknown settlements of the
// embedded evm facilitator from what it knows of the attempt: the nonce's
// user is searched for no further back than it (x402.SentSettlementChecker).
func (m *EVMFacilitator) SentSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error) {
	return m.f.SentSettlementStatus(ctx, p, req, sent)
}

// sentSettlementStatusBy implements signedStatusReader.
func (m *EVMFacilitator) sentSettlementStatusBy(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement, signers func(context.Context, string) evmfacilitator.Signers) (x402.SettlementStatus, error) {
	return m.f.SentSettlementStatusBy(ctx, p, req, sent, signers(ctx, req.Network))
}

var (
	_ x402.SentSettlementChecker = (*EVMFacilitator)(nil)
	_ x402.SettlementChecker     = (*SVMFacilitator)(nil)
	_ siblingReader              = (*SVMFacilitator)(nil)
	_ signedStatusReader         = (*EVMFacilitator)(nil)
	_ signedStatusReader         = (*HTTPFacilitator)(nil)
	_ x402.SettlementChecker     = (*HTTPFacilitator)(nil)
	_ x402.SettlementChecker     = (*MultiFacilitator)(nil)
	_ x402.SentSettlementChecker = (*HTTPFacilitator)(nil)
	_ x402.SentSettlementChecker = (*MultiFacilitator)(nil)
	_ caddy.CleanerUpper         = (*HTTPFacilitator)(nil)
)
