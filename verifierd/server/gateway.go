package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
)

// Headers the gateway sets on requests it forwards. It strips any client
// copies of X-Aov-* first; verifierd still believes them only when the
// request also carries the gateway token, because verifierd may be
// reachable without the gateway (a misconfigured bind, a local client) and
// anyone can send a header.
const (
	HeaderGatewayToken = "X-Aov-Gateway-Token" // shared secret proving the gateway forwarded the request
	HeaderPayment      = "X-Aov-Payment"       // "free" | "paid"
	HeaderPayer        = "X-Aov-Payer"         // payer address of a settled payment
	HeaderNetwork      = "X-Aov-Network"       // CAIP-2 network of that payment
	HeaderWallet       = "X-Aov-Wallet"        // address proven by X-Wallet-Auth
	HeaderWalletAgent  = "X-Aov-Wallet-Agent"  // agent_id that proof binds to the wallet
	HeaderAnswerBy     = "X-Aov-Answer-By"     // Unix milliseconds after which the gateway no longer waits for the answer
	// HeaderSettlement "pending" on a paid call: the gateway settles after
	// this answer and reports the outcome (settlement.go).
	HeaderSettlement = "X-Aov-Settlement"
)

// maxGatewayValue bounds a reported address or network; anything longer or
// with characters outside printable ASCII is dropped, not recorded.
const maxGatewayValue = 128

// gatewayInfo is how the call was paid and who proved which wallet, as far
// as verifierd can trust it.
type gatewayInfo struct {
	trusted bool
	payment string
	payer   string
	network string
	wallet  string
	// walletAgent is the agent_id the wallet proof named, if any.
	walletAgent string
	// answerBy is when the gateway stops waiting for this answer (zero:
	// not said). A verification finished later would be recorded but never
	// delivered, so verifyRequest records none past it (answerMargin).
	answerBy time.Time
}

// gatewayInfo reads the X-Aov-* headers when the request carries the right
// gateway token (compared in constant time over fixed-length hashes, so
// neither content nor length leaks), and otherwise reports the payment as
// unknown.
// The MCP tools read the same headers from the HTTP request that carried
// the tool call: the gateway sets them on /mcp as on every route.
func (s *Server) gatewayInfo(h http.Header, remote string) gatewayInfo {
	info := gatewayInfo{payment: store.PaymentUnknown}
	tok := h.Get(HeaderGatewayToken)
	if tok == "" {
		return info
	}
	got := sha256.Sum256([]byte(tok))
	if !s.gwEnabled || subtle.ConstantTimeCompare(got[:], s.gwToken[:]) != 1 {
		s.log.Warn("gateway headers ignored: wrong gateway token (or none configured)", "remote", remote)
		return info
	}
	info.trusted = true
	switch p := h.Get(HeaderPayment); p {
	case store.PaymentFree, store.PaymentPaid:
		info.payment = p
	}
	if info.payment == store.PaymentPaid && h.Get(HeaderSettlement) == "pending" {
		info.payment = store.PaymentPending
	}
	info.payer = cleanValue(h.Get(HeaderPayer))
	info.network = cleanValue(h.Get(HeaderNetwork))
	info.wallet = cleanValue(h.Get(HeaderWallet))
	if info.wallet != "" {
		info.walletAgent = cleanAgent(h.Get(HeaderWalletAgent))
	}
	if ms, err := strconv.ParseInt(h.Get(HeaderAnswerBy), 10, 64); err == nil && ms > 0 {
		info.answerBy = time.UnixMilli(ms)
	}
	return info
}

// answerMargin is how long before the gateway's answer-by instant a
// verification stops being recorded: the time the answer needs to reach the
// gateway, and the clock difference between two machines it tolerates.
const answerMargin = 100 * time.Millisecond

// lastAnswer is the last instant an answer still reaches the gateway in
// time (its answer-by time less answerMargin); false when the gateway set
// none.
func (gw gatewayInfo) lastAnswer() (time.Time, bool) {
	if gw.answerBy.IsZero() {
		return time.Time{}, false
	}
	return gw.answerBy.Add(-answerMargin), true
}

// tooLate reports whether the gateway will have stopped waiting by the time
// an answer made now reaches it. It is what keeps a verifierd that was
// stalled (paused, swapping, starved) from recording verifications whose
// answers nobody will deliver: those would count toward the agent's
// reputation as if a buyer had seen them.
func (gw gatewayInfo) tooLate(now time.Time) bool {
	last, ok := gw.lastAnswer()
	return ok && !now.Before(last)
}

// storeTimeout bounds a request's history and owner store calls (the
// record of a verification and the owner binding before it, the reads of
// /reputation and /score) when the gateway set no answer-by time, so that
// a stalled store (PostgreSQL paused, its network cut) is a 503 rather
// than a request, a goroutine and a pool connection held for as long as
// the store stays stalled.
const storeTimeout = 10 * time.Second

// storeBy is the deadline of the store calls of a request answered now:
// lastAnswer, and at most storeTimeout away. Past lastAnswer nobody reads
// the answer, so nor is it worth waiting for the store.
func (gw gatewayInfo) storeBy(now time.Time) time.Time {
	by := now.Add(storeTimeout)
	if last, ok := gw.lastAnswer(); ok && last.Before(by) {
		by = last
	}
	return by
}

// errGatewayGaveUp answers a verification finished after the gateway
// stopped waiting: nothing was recorded (and the gateway charged nothing).
func errGatewayGaveUp() error {
	return apierr.Unavailable("verifier", 1, errors.New("finished after the gateway's answer-by time; not recorded"))
}

// cleanAgent accepts the agent_id a proof named as the gateway forwards it
// when a wallet may bind it (store.BindableAgentID, the rule walletauth
// applies to the proof); any other is dropped, so no id a wallet could not
// have named is bound or authenticated.
func cleanAgent(v string) string {
	if !store.BindableAgentID(v) {
		return ""
	}
	return v
}

func cleanValue(v string) string {
	if len(v) > maxGatewayValue {
		return ""
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= ' ' || v[i] > '~' {
			return ""
		}
	}
	return v
}

// # Who owns an agent_id
//
// An agent_id is the agent's name in every verification, and a wallet
// proof (X-Wallet-Auth's agent_id, forwarded as X-Aov-Wallet-Agent) claims
// it. Only the owner's verifications count as authenticated in the trust
// score, so that nobody else can raise or sink it with evidence of
// their own:
//
//   - An account id belongs to its address: a bare EVM address
//     (0x + 40 hex digits, compared without regard to case), a bare
//     Solana address a wallet proof can carry (store.SolanaWalletKey:
//     the canonical base58 of an Ed25519 key, compared exactly), or a CAIP-10
//     account id whose last part is an address a wallet proof can carry:
//     0x + 40 hex (compared without regard to case) or the canonical
//     base58 of 32 bytes (compared exactly); an eip155 id must end in the
//     first kind, a solana id in the second. Its namespace and chain are
//     not compared: one key controls its address on every chain, and ids
//     of other namespaces ending in an address (team:billing:0x…) were
//     always their address's, so their owners keep them. Nothing is
//     recorded for it; no other wallet can ever own it. An id merely
//     shaped like CAIP-10 whose last part is no address ("acme:invoice:v1",
//     an eip155 id ending in base58) is an ordinary name: read as an
//     account, it would belong to an address no wallet can prove, and
//     nobody could ever bind it or be authenticated for it. So is a bare
//     base58 id of 32 bytes that is no Ed25519 key (about half of all
//     32-byte values, readable 43-character names among them). A bare
//     Solana address a wallet bound before the bare-account rule (when it
//     was an ordinary name) keeps that owner (ownerOf): a readable name
//     that is an Ed25519 key nobody holds stays its binder's.
//   - Any other id belongs to the first wallet whose proof named it on a
//     verification call, recorded durably (store.Owners) and never
//     changed. Reserved test- ids are never bound (anyone may use the
//     examples) and never authenticated, nor is an id that is not
//     store.BindableAgentID (cleanAgent drops it): one with an invisible
//     character could read exactly as another's.
//
// A proof from another wallet for an owned id is refused with 403
// (forbidden) before anything is checked, signed or recorded. A
// verification counts as authenticated when its agent_id is the proven
// wallet's own account id, or is the id its proof named and that wallet
// owns it.

// caip10RE is a CAIP-10-shaped id: accountAddress decides which letter
// cases of its namespace make it an account id.
var caip10RE = regexp.MustCompile(`^[-a-zA-Z0-9]{3,8}:[-_a-zA-Z0-9]{1,32}:[-.%a-zA-Z0-9]{1,128}$`)

// accountAddress returns the address an account id names, and false for
// any other id (see Who owns an agent_id). A namespace is CAIP-10's when
// it is written in lower case, and eip155 and solana also in any other:
// EIP155:8453:0xAbc… reads as that account to anyone comparing ids, so no
// other wallet may bind it. Other namespaces with a capital stay ordinary
// names (Team:billing:0xAbc… could be, and may have been, bound by a
// wallet before), so no owner recorded for one is ever overruled.
func accountAddress(agentID string) (string, bool) {
	// A bare address is its account's id, EVM or Solana alike: otherwise
	// any wallet naming a bare Solana address first would own it, and the
	// Solana wallet it spells would be refused its own address. A bare
	// Solana address is one a wallet proof can carry (the check walletauth
	// applies), since a bare id is not marked as an account: a name that
	// merely decodes to 32 bytes stays the name its binder owns.
	if store.IsEVMAddress(agentID) {
		return agentID, true
	}
	if _, ok := store.SolanaWalletKey(agentID); ok {
		return agentID, true
	}
	if !caip10RE.MatchString(agentID) {
		return "", false
	}
	namespace, _, _ := strings.Cut(agentID, ":")
	lower := strings.ToLower(namespace)
	if lower != namespace && lower != "eip155" && lower != "solana" {
		return "", false
	}
	addr := agentID[strings.LastIndexByte(agentID, ':')+1:]
	evm, sol := store.IsEVMAddress(addr), store.IsSolanaAddress(addr)
	switch lower {
	case "eip155":
		sol = false
	case "solana":
		evm = false
	}
	if evm || sol {
		return addr, true
	}
	return "", false
}

// ownerOf returns agentID's owner: the address of an account id, the
// recorded owner of any other id ("" when none or when there is no owner
// store), binding it to bindTo first when bindTo is set and the id is
// unowned.
//
// A bare Solana address is read as its account only when nobody bound it:
// before the bare-account rule it was an ordinary name, and a readable
// name may be the base58 of an Ed25519 key nobody holds, so the wallet
// that bound one then keeps it (a squatter's binding of a real address
// too: owners are never changed). No new binding of one is made.
func (s *Server) ownerOf(ctx context.Context, agentID, bindTo string) (string, error) {
	if addr, ok := accountAddress(agentID); ok {
		bareSolana := addr == agentID && !store.IsEVMAddress(agentID)
		if !bareSolana || s.owners == nil {
			return addr, nil
		}
		owner, err := s.owners.AgentOwner(ctx, agentID)
		if err != nil || owner != "" {
			return owner, err
		}
		return addr, nil
	}
	if s.owners == nil || strings.HasPrefix(agentID, store.TestAgentPrefix) {
		return "", nil
	}
	if bindTo != "" {
		return s.owners.BindAgent(ctx, agentID, bindTo)
	}
	return s.owners.AgentOwner(ctx, agentID)
}

// authenticate decides whether a verification of agentID counts as the
// agent's own, and enforces ownership: a proof naming an id another wallet
// owns is refused (403), and a proof naming an unowned id binds it to the
// proven wallet. It runs before the verification is checked, so a refusal
// leaves no receipt and no record.
func (s *Server) authenticate(ctx context.Context, agentID string, gw gatewayInfo) (bool, error) {
	if gw.wallet == "" {
		return false, nil
	}
	owned := false
	if gw.walletAgent != "" {
		owner, err := s.ownerOf(ctx, gw.walletAgent, gw.wallet)
		if err != nil {
			return false, apierr.Unavailable("agent owner store", 5, fmt.Errorf("binding agent: %w", err))
		}
		if owner != "" && !store.SameWallet(owner, gw.wallet) {
			return false, apierr.Forbidden("the wallet proof names an agent_id that belongs to another wallet", "use_own_agent_id",
				apierr.Field{Field: "X-Wallet-Auth.agent_id", Problem: "belongs to another wallet",
					Fix: "Bind an agent_id of your own, or use your wallet's CAIP-10 account id (eip155:<chain>:<address>) as agent_id."})
		}
		owned = owner != ""
	}
	if agentID == "" {
		return false, nil
	}
	if agentID == gw.walletAgent {
		return owned, nil // owned by gw.wallet: another owner is refused above
	}
	if _, ok := accountAddress(agentID); ok {
		owner, err := s.ownerOf(ctx, agentID, "")
		if err != nil {
			return false, apierr.Unavailable("agent owner store", 5, fmt.Errorf("reading agent owner: %w", err))
		}
		return store.SameWallet(owner, gw.wallet), nil
	}
	return false, nil
}

// ownerEvidence reports whether a recorded verification counts as the
// owner's in a score: it was authenticated, and by the wallet that owns
// the agent now. Records authenticated before ownership was enforced, by
// a wallet that does not own the id, count as unauthenticated labels.
func ownerEvidence(v store.Verification, owner string) bool {
	return v.Authenticated && store.SameWallet(v.Wallet, owner)
}
