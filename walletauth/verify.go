package walletauth

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/accounts"
	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/rpc"
	"golang.org/x/sync/singleflight"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// Chain is what EIP-1271 verification needs from a chain client; an
// ethclient.Client or a simulated backend's client provides it.
type Chain interface {
	ethereum.ContractCaller
	// CodeAt tells a contract wallet (which has code) from an address
	// whose answer to any call proves nothing (an account, a precompile).
	CodeAt(ctx context.Context, account common.Address, blockNumber *big.Int) ([]byte, error)
	ChainID(ctx context.Context) (*big.Int, error)
}

// Verifier checks proofs. The zero value checks signatures of accounts
// only, with the default lifetime and skew, and without replay protection;
// a gateway always sets Nonces.
type Verifier struct {
	// MaxLifetime bounds expiration_time − issued_at. Default
	// DefaultMaxLifetime.
	MaxLifetime time.Duration
	// ClockSkew is how far issued_at and not_before may be ahead of our
	// clock. Default DefaultClockSkew.
	ClockSkew time.Duration
	// Chain, when set, lets contract wallets sign: a signature that does
	// not recover to the address is offered to the address's EIP-1271
	// isValidSignature, on this chain only (a proof naming another chain
	// is refused).
	Chain Chain
	// ChainTimeout bounds how long a contract-wallet check waits on Chain
	// (for its id and isValidSignature together); past it the check fails
	// with an error, not a refusal (the gateway's 503). Anyone can make
	// the verifier call: a proof whose signature does not recover costs an
	// eth_call. Without a bound of its own a stalled RPC would hold each
	// such request for as long as its client waits. Default
	// DefaultChainTimeout.
	ChainTimeout time.Duration
	// Nonces makes every nonce single-use: it is claimed (per address)
	// until the proof expires. Nil turns replay protection off, which only
	// offline checks and tests may do.
	Nonces store.Claims
	// Domains are the site names proofs may be for (host, with the port
	// when clients address one; compared without regard to case). When
	// set, a proof's domain must be one of them, and Expect.Domain and
	// SIWXExpect.Domain are not used. A gateway sets them from its
	// configuration: the request's Host header is the client's choice, so
	// comparing with it would accept a proof signed for another site.
	Domains []string
	// Now is the clock. Default time.Now.
	Now func() time.Time

	chainMu  sync.Mutex
	chainID  string             // CAIP-2 of Chain, once known
	chainAsk singleflight.Group // the one eth_chainId in flight
}

// DefaultChainTimeout is ChainTimeout unless set: a healthy RPC answers an
// eth_call in well under a second.
const DefaultChainTimeout = 5 * time.Second

// Expect is the request a proof must be for.
type Expect struct {
	// Domain is the host (and port, if the client addressed one) the
	// request was sent to, compared without regard to case; ignored when
	// the Verifier has Domains.
	Domain string
	// Method is the request's method.
	Method string
	// Path is the request's path as the client sent it, escaped (as
	// url.URL.EscapedPath gives it; not the query), compared with the
	// proof's path in CanonicalPath's form (SamePath), as a sign-in-with-x
	// proof's is: the decoded path would make /a%2Fb and /a/b, which a
	// server may route as different resources, one.
	Path string
	// NonceSpent checks the proof in every other way but leaves its nonce
	// unclaimed: set it only when this same proof was already verified,
	// its nonce claimed, for this very request (a gateway's second check of
	// a request's proof under other settings). Never from anything the
	// client sent: it turns replay protection off for the check.
	NonceSpent bool
}

// Proof is what a verified proof establishes.
type Proof struct {
	// Address is the wallet that signed (EVM).
	Address common.Address
	// Account is the wallet that signed when it is not an EVM account (a
	// Solana account's base58 address); Wallet returns either as text.
	Account string
	// AgentID is the agent bound to the wallet ("" when none).
	AgentID string
	// ChainID is the CAIP-2 chain the proof names.
	ChainID string
	// Contract is true when the signature was accepted by the wallet's
	// EIP-1271 contract rather than recovered.
	Contract bool
	// Expires is when the proof stops being valid.
	Expires time.Time

	nonce *store.Claim // the claim the check made on the nonce (ReleaseNonce); nil when none
}

// ourDomain reports whether domain is one the proof may name: one of
// Domains when set, else the expected one.
func (v *Verifier) ourDomain(domain, expected string) bool {
	if len(v.Domains) == 0 {
		return strings.EqualFold(domain, expected)
	}
	for _, d := range v.Domains {
		if strings.EqualFold(domain, d) {
			return true
		}
	}
	return false
}

// ValidDomain reports whether s can be a proof's domain: a host name, an
// IPv4 address or a bracketed IPv6 address, with an optional port.
func ValidDomain(s string) bool { return authorityRE.MatchString(s) }

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

func (v *Verifier) maxLifetime() time.Duration {
	if v.MaxLifetime > 0 {
		return v.MaxLifetime
	}
	return DefaultMaxLifetime
}

func (v *Verifier) chainTimeout() time.Duration {
	if v.ChainTimeout > 0 {
		return v.ChainTimeout
	}
	return DefaultChainTimeout
}

func (v *Verifier) skew() time.Duration {
	if v.ClockSkew > 0 {
		return v.ClockSkew
	}
	return DefaultClockSkew
}

// Verify parses an X-Wallet-Auth value and checks it against the request.
// A refusal is an *Error (answer 401); any other error means the check
// could not be made (the nonce store or the chain is unavailable: answer
// 503).
func (v *Verifier) Verify(ctx context.Context, header string, want Expect) (Proof, error) {
	e, err := Parse(header)
	if err != nil {
		return Proof{}, err
	}
	return v.VerifyEnvelope(ctx, e, want)
}

// VerifyEnvelope checks a parsed envelope: request, time, signature, then
// the nonce, in that order, so a proof that fails cheaply never costs a
// chain call or a store write.
func (v *Verifier) VerifyEnvelope(ctx context.Context, e *Envelope, want Expect) (Proof, error) {
	h := HeaderName
	if !v.ourDomain(e.Domain, want.Domain) {
		return Proof{}, refuse(ErrWrongRequest, h, "domain", "is not this server's site name", "Sign a proof for the site name you send the request to.")
	}
	if e.Method != want.Method {
		return Proof{}, refuse(ErrWrongRequest, h, "method", "is not the request's method", "Sign a proof for this request's method.")
	}
	if !SamePath(e.Path, want.Path) {
		return Proof{}, refuse(ErrWrongRequest, h, "path", "is not the request's path", "Sign a proof for this request's path.")
	}
	issued, _ := parseTime(h, "issued_at", e.IssuedAt)
	expires, _ := parseTime(h, "expiration_time", e.ExpirationTime)
	now := v.now()
	if !expires.After(issued) {
		return Proof{}, refuse(ErrMalformed, h, "expiration_time", "is not after issued_at", "Set expiration_time after issued_at.")
	}
	if expires.Sub(issued) > v.maxLifetime() {
		return Proof{}, refuse(ErrLifetime, h, "expiration_time", fmt.Sprintf("is more than %s after issued_at", v.maxLifetime()), "Sign proofs that expire sooner.")
	}
	if issued.After(now.Add(v.skew())) {
		return Proof{}, refuse(ErrNotYetValid, h, "issued_at", "is in the future", "Check your clock and sign a fresh proof.")
	}
	if e.NotBefore != "" {
		nb, _ := parseTime(h, "not_before", e.NotBefore)
		if nb.After(now.Add(v.skew())) {
			return Proof{}, refuse(ErrNotYetValid, h, "not_before", "is in the future", "Send the request after not_before, or sign without it.")
		}
	}
	if !now.Before(expires) {
		return Proof{}, refuse(ErrExpired, h, "expiration_time", "is in the past", "Sign a fresh proof for each request.")
	}
	if IsSolanaChain(e.ChainID) {
		claim, err := v.verifySolana(ctx, h, e.Message(), e.Address, e.Signature, e.Nonce, expires, want.NonceSpent)
		if err != nil {
			return Proof{}, err
		}
		return Proof{Account: e.Address, AgentID: e.AgentID, ChainID: e.ChainID, Expires: expires, nonce: claim}, nil
	}
	addr := common.HexToAddress(e.Address)
	sig, _ := parseSignature(h, e.Signature)
	contract, err := v.checkSignature(ctx, h, e.Message(), addr, e.ChainID, sig)
	if err != nil {
		return Proof{}, err
	}
	claim, err := v.claimNonce(ctx, h, addr, e.Nonce, expires, want.NonceSpent)
	if err != nil {
		return Proof{}, err
	}
	return Proof{Address: addr, AgentID: e.AgentID, ChainID: e.ChainID, Contract: contract, Expires: expires, nonce: claim}, nil
}

// checkSignature accepts sig over text when it recovers to addr, or else
// when addr's EIP-1271 contract on the configured chain accepts it.
func (v *Verifier) checkSignature(ctx context.Context, header, text string, addr common.Address, chainID string, sig []byte) (contract bool, err error) {
	digest := [32]byte(accounts.TextHash([]byte(text)))
	if len(sig) == 65 {
		if signer, err := x402.RecoverAuthorizer(digest, sig); err == nil && signer == addr {
			return false, nil
		}
	}
	bad := refuse(ErrBadSignature, header, "signature", "is not a signature of this message by the address", "Sign the EIP-4361 text of exactly these fields with the address's key (EIP-191 personal_sign).")
	if v.Chain == nil {
		return false, bad
	}
	// One deadline for the whole check, so a request waits at most
	// ChainTimeout on the chain, however many calls it takes.
	ctx, cancel := context.WithTimeout(ctx, v.chainTimeout())
	defer cancel()
	ours, err := v.chain(ctx)
	if err != nil {
		return false, err
	}
	if chainID != ours {
		return false, bad
	}
	ok, err := isValidSignature(ctx, v.Chain, addr, digest, sig)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, bad
	}
	return true, nil
}

// chain returns the configured chain's CAIP-2 id, asking it until it is
// known. No lock is held across the call: concurrent checks share the one
// call in flight (so a stalled RPC gets one eth_chainId, not one per
// request), and each waits only as long as its own context allows. The
// call itself is detached from the request that started it, so that
// client leaving does not fail the others, and bounded by ChainTimeout.
// A failure is not remembered: the next check asks again.
func (v *Verifier) chain(ctx context.Context) (string, error) {
	v.chainMu.Lock()
	id := v.chainID
	v.chainMu.Unlock()
	if id != "" {
		return id, nil
	}
	asked := v.chainAsk.DoChan("", func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.chainTimeout())
		defer cancel()
		n, err := v.Chain.ChainID(ctx)
		if err != nil {
			return "", err
		}
		id := "eip155:" + n.String()
		v.chainMu.Lock()
		v.chainID = id
		v.chainMu.Unlock()
		return id, nil
	})
	select {
	case r := <-asked:
		if r.Err != nil {
			return "", fmt.Errorf("asking the chain for its id: %w", r.Err)
		}
		return r.Val.(string), nil
	case <-ctx.Done():
		return "", fmt.Errorf("asking the chain for its id: %w", context.Cause(ctx))
	}
}

// erc1271 is EIP-1271's one method.
var erc1271, _ = abi.JSON(strings.NewReader(`[{"type":"function","name":"isValidSignature","stateMutability":"view",
 "inputs":[{"name":"hash","type":"bytes32"},{"name":"signature","type":"bytes"}],
 "outputs":[{"name":"","type":"bytes4"}]}]`))

// isValidSignature asks wallet whether sig is its signature over digest. An
// address without code (an account, or a precompile, whose answer can be
// anything), a revert or other halt of its code, or any answer but EIP-1271's exact one
// (x402.ERC1271Accepts) is a no; a failed call is an error, never a yes.
func isValidSignature(ctx context.Context, c Chain, wallet common.Address, digest [32]byte, sig []byte) (bool, error) {
	data, err := erc1271.Pack("isValidSignature", digest, sig)
	if err != nil {
		return false, nil
	}
	code, err := c.CodeAt(ctx, wallet, nil)
	if err != nil {
		return false, fmt.Errorf("%w: reading the wallet's code: %w", ErrChainCheck, err)
	}
	if len(code) == 0 {
		return false, nil
	}
	out, err := c.CallContract(ctx, ethereum.CallMsg{To: &wallet, Data: data}, nil)
	if err != nil {
		if refusedByWallet(err) {
			return false, nil
		}
		return false, fmt.Errorf("%w: calling isValidSignature: %w", ErrChainCheck, err)
	}
	return x402.ERC1271Accepts(out), nil
}

// evmHalts are the messages of go-ethereum's EVM execution errors
// (core/vm/errors.go) a call to a contract can end with: a revert, and the
// exceptional halts (running out of gas, an invalid opcode or jump, the
// stack's bounds). Each is the contract's own doing, the same on every
// retry. Kept as text rather than imported so this package does not pull
// the EVM into every program that signs proofs; TestEVMHaltsAreGethsErrors
// holds them to go-ethereum's.
var evmHalts = []string{
	"execution reverted",
	"out of gas",
	"invalid opcode",
	"invalid jump destination",
	"stack underflow",
	"stack limit reached",
	"return data out of bounds",
	"gas uint64 overflow",
	"write protection",
	"max call depth exceeded",
}

// refusedByWallet reports whether err is the chain's answer that the
// wallet's code ran and did not return: a revert or an exceptional halt,
// the wallet's refusal of the signature, final. go-ethereum answers a
// revert with JSON-RPC error code 3 ("execution reverted", the reason in
// its data), and any other execution error with code -32000 and the EVM's
// message, over HTTP and in process alike. Counting a halt as an outage
// would let anyone deploy a contract that halts and have the gateway
// answer 503, retryable, and call the chain, for every copy of one proof.
// Any other error object (a provider's -32005 rate limit or -32603
// internal error, "header not found") or a transport error says nothing
// about the signature: the check failed, and the caller answers 503, never
// a refusal a valid proof would get.
func refusedByWallet(err error) bool {
	var re rpc.Error
	if !errors.As(err, &re) {
		return false
	}
	if re.ErrorCode() == 3 {
		return true
	}
	msg := re.Error()
	return slices.ContainsFunc(evmHalts, func(h string) bool { return strings.HasPrefix(msg, h) })
}

// nonceKey is the claim that makes a wallet's nonce single-use, the same
// for every proof format: X-Wallet-Auth and sign-in-with-x sign the same
// kind of text, so a claim per format would let one signature be spent
// once under each header. Keying on (wallet, nonce) rather than on the
// signed text's hash makes the nonce itself single-use, as EIP-4361 and
// SPEC §9 mean it: a wallet that signs two different texts with one nonce
// gets one of them accepted, whichever headers carry them, and a proof
// format added later is covered without a thought. wallet is the lower-case
// hex address of an EVM account, "solana/" and the base58 address of a
// Solana one. The prefix is the one X-Wallet-Auth always claimed under, so
// its live claims carry over an upgrade; sign-in-with-x's old
// "siwx/nonce/…" claims simply lapse (within SIWXMaxAge).
func nonceKey(wallet, nonce string) string { return "wallet-auth/nonce/" + wallet + "/" + nonce }

// claimNonce makes (address, nonce) single-use until until, unless spent
// (Expect.NonceSpent), as claimNonceKey.
func (v *Verifier) claimNonce(ctx context.Context, header string, addr common.Address, nonce string, until time.Time, spent bool) (*store.Claim, error) {
	return v.claimNonceKey(ctx, header, nonceKey(strings.ToLower(addr.Hex()), nonce), until, spent)
}

// claimNonceKey makes key single-use until until, unless spent
// (Expect.NonceSpent), and returns the claim it made (nil when none).
func (v *Verifier) claimNonceKey(ctx context.Context, header, key string, until time.Time, spent bool) (*store.Claim, error) {
	if v.Nonces == nil || spent {
		return nil, nil
	}
	c, err := v.Nonces.Claim(ctx, []string{key}, until)
	if errors.Is(err, store.ErrClaimed) {
		return nil, refuse(ErrReplayed, header, "nonce", "was already used", "Sign a fresh proof with a new nonce for every request.")
	}
	if err != nil {
		return nil, fmt.Errorf("claiming the proof's nonce: %w", err)
	}
	return &c, nil
}

// ReleaseNonce gives back the nonce claim v made checking p, so the same
// proof can be sent again. It is for a gateway that refuses the request
// after the check passed for a reason its client is told to retry (a 503,
// a 429), before anything served it: released once the request was
// served, the proof could be replayed. Nothing when the check claimed
// nothing (Expect.NonceSpent, no Nonces).
func (v *Verifier) ReleaseNonce(ctx context.Context, p Proof) error {
	if p.nonce == nil {
		return nil
	}
	return v.Nonces.Release(ctx, *p.nonce)
}
