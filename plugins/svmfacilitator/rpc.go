package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// RPC is a Solana JSON-RPC client for the few methods a facilitator calls.
// Every call is bounded by the context and by Timeout; replies are capped at
// 1 MiB, so a stalled or lying node costs a bounded wait and nothing else.
type RPC struct {
	URL     string
	Client  *http.Client  // default: rpcClient
	Timeout time.Duration // per call; default 10s
	id      atomic.Int64
	// seen holds the floors of the processed and confirmed banks a
	// judgement may take (slotFloor), kept per RPC: the node or pool
	// behind one URL.
	seen [2]slotFloor
}

// Commitment levels, as seen indexes them.
const (
	processed = iota
	confirmed
)

var commitments = [2]string{processed: "processed", confirmed: "confirmed"}

// floorHold is how long an endpoint must answer from banks older than its
// floor, and from none at or past it, before the floor lapses (slotFloor).
// In a healthy pool a node at the tip answers again within seconds, and a
// node that named a slot passes it within a second or two, so a minute is
// far past any honest lag, and short beside the claims a held payment
// keeps.
const floorHold = time.Minute

// slotFloor is the newest bank of one commitment level an endpoint has
// shown: a judgement of expiry (blockhashExpired) and a reading of the
// chain's clock (attributed) ask a bank no older, so one node of a pool
// behind another that answered cannot make them. A slot is taken as the
// floor as soon as a reply names it, so that the very next answer of a
// lagging node is refused. But a reply may name a slot the chain never
// reaches (a member of another cluster, a lying provider): held for good,
// it would leave every later judgement through the endpoint undecided, a
// charged buyer never served, until the process restarts. So once the
// endpoint has answered only from older banks for floorHold (counted from
// the first of them, so a quiet endpoint keeps its floor), the floor
// lapses to the newest of those, logged. Any answer at or past the floor
// shows it real again and restarts the count; a liar that keeps naming
// its slot keeps the floor, and the reads through it undecided, while it
// does.
type slotFloor struct {
	mu   sync.Mutex
	slot uint64
	// olderSince is when the answers from older banks began: the first
	// since the last answer at or past slot; zero while there is none.
	olderSince time.Time
	// below is the newest bank of those answers: where slot lapses to.
	below uint64
}

// saw records an answer from a bank at slot at time t (a bank's data, a
// slot a node named, or an answer refused as older than asked:
// behindError).
func (f *slotFloor) saw(slot uint64, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case slot >= f.slot:
		f.slot, f.olderSince, f.below = slot, time.Time{}, 0
	case f.olderSince.IsZero():
		f.olderSince, f.below = t, slot
	default:
		f.below = max(f.below, slot)
	}
}

// at returns the floor at time t, and the slot that lapsed to it, if any.
func (f *slotFloor) at(t time.Time) (floor, lapsed uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.olderSince.IsZero() && t.Sub(f.olderSince) > floorHold {
		lapsed, f.slot, f.olderSince, f.below = f.slot, f.below, time.Time{}, 0
	}
	return f.slot, lapsed
}

// seenAt returns the floor of a bank at commitment level (processed or
// confirmed) the node (or pool) behind c has set so far (slotFloor), 0
// before any answer.
func (c *RPC) seenAt(level int) uint64 {
	floor, lapsed := c.seen[level].at(now())
	if lapsed != 0 {
		log.Printf("svm facilitator: the rpc endpoint showed %s slot %d, then for %s answered only from older banks: taking slot %d as its newest", commitments[level], lapsed, floorHold, floor)
	}
	return floor
}

// saw records an answer from a bank of commitment level at slot
// (slotFloor).
func (c *RPC) saw(level int, slot uint64) { c.seen[level].saw(slot, now()) }

// atLeastSeen is atLeast for an answer of a bank of commitment level,
// recorded (saw) whether or not it is new enough: an answer refused as
// older than asked is one of the older answers a floor lapses on.
func (c *RPC) atLeastSeen(level int, method string, slot, minSlot uint64) error {
	c.saw(level, slot)
	return atLeast(method, slot, minSlot)
}

// rpcClient is the default client: http.DefaultClient's transport keeps two
// idle connections per host, and a facilitator talks to one node with as
// many calls in flight as payments (a Settle holds its call while it
// polls), so every further call dialed a fresh connection and left one in
// TIME_WAIT, a TCP handshake for both processes on most calls under load.
// This one keeps them all open for the next calls. It has no timeout of
// its own (Timeout and the caller's context bound each call).
var rpcClient = &http.Client{Transport: keepAliveTransport()}

func keepAliveTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = tr.MaxIdleConns
	return tr
}

// RPCError is the node's answer refusing a call (a JSON-RPC error object):
// the node was reached and said no. Anything else a call returns means no
// answer.
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
	// HTTPStatus is the status of the reply that carried the error.
	HTTPStatus int `json:"-"`
}

func (e *RPCError) Error() string { return fmt.Sprintf("solana rpc error %d: %s", e.Code, e.Message) }

// Rejects reports whether the node answered that the transaction itself
// is unacceptable, so the payment is at fault: -32002 (preflight
// simulation failed), -32003 (signature verification failed), -32013
// (signature length mismatch) or -32602 (invalid params: the transaction
// does not decode or sanitize), in a 200 or a 4xx reply (some providers
// carry a node's refusal in a 400). Anything else is the node's own
// trouble, not the buyer's: a rate limit (429, with or without a JSON-RPC
// body), a node behind (-32005), an internal error, an error body behind a
// proxy's 5xx. Calling the payment invalid then would tell the buyer to
// sign again, and drop a settle-after payment as not charged after the
// upstream ran; it is an error instead (the gateway answers 503). A 429 is
// never a refusal, whatever code it carries: it says to come back later.
func (e *RPCError) Rejects() bool {
	if e.HTTPStatus != http.StatusOK && (e.HTTPStatus < 400 || e.HTTPStatus > 499 || e.HTTPStatus == http.StatusTooManyRequests) {
		return false
	}
	switch e.Code {
	case -32002, -32003, -32013, -32602:
		return true
	}
	return false
}

// Refused reports whether a sendTransaction answered with e was certainly
// not forwarded: the node rejected the transaction (Rejects), or answered
// (HTTP 200) that it could not take the request (-32600, -32601).
// Anything else, an internal error or an error body behind a proxy's 502
// or 504, may have come after the transaction went out: the caller must
// ask the chain, not take it for a refusal. A refusal because the chain
// already processed the transaction (AlreadyProcessed) means the transfer
// happened, by another send: the caller must check that first.
func (e *RPCError) Refused() bool {
	return e.Rejects() || e.HTTPStatus == http.StatusOK && (e.Code == -32600 || e.Code == -32601)
}

// AlreadyProcessed reports whether e is a preflight failure (-32002) whose
// transaction error is AlreadyProcessed: the chain holds this very
// transaction already. A node answers so to a send with preflight (and
// some, like the local test chain, with skipPreflight too; others return
// the signature as for a first send).
func (e *RPCError) AlreadyProcessed() bool {
	return alreadyProcessed(e.TxErr())
}

// TxErr returns the transaction error a preflight failure (-32002)
// carries in its data, or nil.
func (e *RPCError) TxErr() json.RawMessage {
	var d struct {
		Err json.RawMessage `json:"err"`
	}
	if e.Code != -32002 || json.Unmarshal(e.Data, &d) != nil {
		return nil
	}
	return d.Err
}

// feeFault is whose a failed simulation's transaction error is, as far as
// the error alone tells (feePayerError).
type feeFault int

const (
	// notFeePayers: the payment's (another account's, an instruction's).
	notFeePayers feeFault = iota
	// feePayerUnusable: the fee payer cannot pay any fee. The chain has no
	// account for it (AccountNotFound: Agave loads the fee payer before
	// anything else and answers so only for it; a missing token account
	// fails in the token program, as an InstructionError), or a program
	// owns it or it holds data (InvalidAccountForFee). The operator's to
	// fix, and every payment meets it alike.
	feePayerUnusable
	// feePayerShort: the fee payer holds too few lamports for this
	// transaction's fee (InsufficientFundsForFee), or paying it would
	// leave it below rent exemption (InsufficientFundsForRent of account
	// 0, which Verify requires to be the fee payer). The fee includes the
	// priority fee the buyer chose, so this is the operator's outage only
	// when the fee payer cannot pay even the base fee (shortOfBaseFee);
	// else it is the payment asking for more than the fee payer holds.
	feePayerShort
)

// feePayerError reports whether a transaction error (JSON, as nodes
// serialize Agave's TransactionError) is the fee payer's, and how
// (feeFault).
func feePayerError(err json.RawMessage) feeFault {
	var name string
	if json.Unmarshal(err, &name) == nil {
		switch name {
		case "AccountNotFound", "InvalidAccountForFee":
			return feePayerUnusable
		case "InsufficientFundsForFee":
			return feePayerShort
		}
		return notFeePayers
	}
	var rent struct {
		InsufficientFundsForRent *struct {
			AccountIndex *int `json:"account_index"`
		}
	}
	if json.Unmarshal(err, &rent) == nil && rent.InsufficientFundsForRent != nil &&
		rent.InsufficientFundsForRent.AccountIndex != nil && *rent.InsufficientFundsForRent.AccountIndex == 0 {
		return feePayerShort
	}
	return notFeePayers
}

// alreadyProcessed reports whether a transaction error (JSON, as nodes
// serialize Agave's TransactionError) is AlreadyProcessed: the signature is
// in the chain's status cache, the transaction landed (or failed on chain).
func alreadyProcessed(err json.RawMessage) bool {
	return string(bytes.TrimSpace(err)) == `"AlreadyProcessed"`
}

const maxRPCReply = 1 << 20

func (c *RPC) call(ctx context.Context, method string, params []any, out any) error {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id.Add(1), "method": method, "params": params})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	hc := c.Client
	if hc == nil {
		hc = rpcClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("solana rpc %s: %w", method, hideEndpointPath(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxRPCReply+1))
	if err != nil {
		return fmt.Errorf("solana rpc %s: %w", method, err)
	}
	if len(b) > maxRPCReply {
		return fmt.Errorf("solana rpc %s: reply over %d bytes", method, maxRPCReply)
	}
	var env struct {
		Result json.RawMessage `json:"result"`
		Error  *RPCError       `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("solana rpc %s: status %d, not JSON-RPC", method, resp.StatusCode)
	}
	if env.Error != nil {
		env.Error.HTTPStatus = resp.StatusCode
		return env.Error
	}
	if len(env.Result) == 0 {
		return fmt.Errorf("solana rpc %s: status %d, no result", method, resp.StatusCode)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(env.Result, out); err != nil {
		return fmt.Errorf("solana rpc %s: malformed result: %w", method, err)
	}
	return nil
}

// hideEndpointPath names the endpoint in err, an error of net/http's
// client, by its scheme and host alone: the client quotes the whole URL,
// and a provider's API key is often its path or query
// (https://mainnet.helius-rpc.com/?api-key=<key>), which would then be
// logged with every failed call.
func hideEndpointPath(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil && u.Host != "" {
			ue.URL = u.Scheme + "://" + u.Host
		} else {
			ue.URL = "the rpc endpoint"
		}
	}
	return err
}

// SimulateResult is simulateTransaction's value.
type SimulateResult struct {
	Err  json.RawMessage `json:"err"`
	Logs []string        `json:"logs"`
	// Slot is the slot of the bank the simulation ran in (the reply's
	// context): a node at that slot knew the transaction's blockhash when
	// the simulation succeeded (see behindError).
	Slot uint64 `json:"-"`
}

// Failed reports whether the simulation failed (err not null).
func (s SimulateResult) Failed() bool { return len(s.Err) > 0 && string(s.Err) != "null" }

// AlreadyProcessed reports whether the simulation failed because the chain
// already processed this very transaction.
func (s SimulateResult) AlreadyProcessed() bool { return alreadyProcessed(s.Err) }

// Simulate runs a signed transaction against the latest state, checking
// signatures and the blockhash as the chain would.
func (c *RPC) Simulate(ctx context.Context, raw []byte) (SimulateResult, error) {
	var out struct {
		Context rpcContext     `json:"context"`
		Value   SimulateResult `json:"value"`
	}
	cfg := map[string]any{"encoding": "base64", "sigVerify": true, "commitment": "confirmed"}
	err := c.call(ctx, "simulateTransaction", []any{base64.StdEncoding.EncodeToString(raw), cfg}, &out)
	out.Value.Slot = out.Context.Slot
	if err == nil {
		c.saw(confirmed, out.Context.Slot)
	}
	return out.Value, err
}

// Send submits a signed transaction without preflight (it was just
// simulated) and returns its signature.
func (c *RPC) Send(ctx context.Context, raw []byte) (string, error) {
	var sig string
	cfg := map[string]any{"encoding": "base64", "skipPreflight": true, "preflightCommitment": "confirmed", "maxRetries": 0}
	err := c.call(ctx, "sendTransaction", []any{base64.StdEncoding.EncodeToString(raw), cfg}, &sig)
	return sig, err
}

// SignatureStatus is one getSignatureStatuses entry.
type SignatureStatus struct {
	Slot               uint64          `json:"slot"`
	Err                json.RawMessage `json:"err"`
	ConfirmationStatus string          `json:"confirmationStatus"`
}

// rpcContext is the context of a reply: the slot of the bank that
// answered.
type rpcContext struct {
	Slot uint64 `json:"slot"`
}

// behindError is a reply from a bank older than the slot a judgement
// needs (minSlot): the node (one of a load-balanced pool, say) is behind
// the one that accepted the transaction. Such a node does not know a
// blockhash or a signature the newer one knew, and answers exactly as if
// the blockhash had expired or the transaction never landed; its answer
// tells nothing. Agave answers so itself (-32016, "Minimum context slot
// has not been reached") where it takes minContextSlot; behindError is
// the same check made here, for the methods that do not take it and the
// nodes or proxies that ignore it.
type behindError struct {
	method        string
	slot, minSlot uint64
}

func (e *behindError) Error() string {
	return fmt.Sprintf("solana rpc %s: answered at slot %d, before slot %d (the node is behind)", e.method, e.slot, e.minSlot)
}

// atLeast returns a behindError when a reply of method at slot is older
// than minSlot.
func atLeast(method string, slot, minSlot uint64) error {
	if slot < minSlot {
		return &behindError{method: method, slot: slot, minSlot: minSlot}
	}
	return nil
}

// CodeNoTransactionHistory is the node's answer to searchTransactionHistory
// when it keeps no transaction history (its operator did not enable
// --enable-rpc-transaction-history): it cannot tell whether a transaction
// landed, so a facilitator cannot settle through it.
const CodeNoTransactionHistory = -32011

// Status returns the status of one signature, nil when the node does not
// know it, and the slot it answered at; an answer from a bank older than
// minSlot is a behindError (getSignatureStatuses takes no minContextSlot).
func (c *RPC) Status(ctx context.Context, sig string, minSlot uint64) (*SignatureStatus, uint64, error) {
	var out struct {
		Context rpcContext         `json:"context"`
		Value   []*SignatureStatus `json:"value"`
	}
	if err := c.call(ctx, "getSignatureStatuses", []any{[]string{sig}, map[string]any{"searchTransactionHistory": true}}, &out); err != nil {
		var re *RPCError
		if errors.As(err, &re) && re.Code == CodeNoTransactionHistory {
			return nil, 0, fmt.Errorf("%w (the node at rpc_url keeps no transaction history, so no payment can be settled through it: use a node run with --enable-rpc-transaction-history, as RPC providers' are)", err)
		}
		return nil, 0, err
	}
	if len(out.Value) != 1 {
		return nil, 0, errors.New("solana rpc getSignatureStatuses: not one status for one signature")
	}
	// Agave answers getSignatureStatuses from the processed bank.
	if err := c.atLeastSeen(processed, "getSignatureStatuses", out.Context.Slot, minSlot); err != nil {
		return nil, 0, err
	}
	return out.Value[0], out.Context.Slot, nil
}

// BlockhashValidAt reports whether a transaction with this blockhash can
// still be included, as the bank of one commitment level (processed or
// confirmed), at minSlot or later, sees it, and the slot of that bank
// (judge expiry with blockhashExpired, which asks two). A bank older than
// minSlot is an error (the node's -32016, or a behindError), never false:
// such a node answers false for a blockhash it has not seen yet as for one
// expired.
func (c *RPC) BlockhashValidAt(ctx context.Context, blockhash string, level int, minSlot uint64) (bool, uint64, error) {
	commitment := commitments[level]
	var out struct {
		Context rpcContext `json:"context"`
		Value   bool       `json:"value"`
	}
	cfg := map[string]any{"commitment": commitment}
	if minSlot > 0 {
		cfg["minContextSlot"] = minSlot
	}
	if err := c.call(ctx, "isBlockhashValid", []any{blockhash, cfg}, &out); err != nil {
		return false, 0, err
	}
	if err := c.atLeastSeen(level, "isBlockhashValid", out.Context.Slot, minSlot); err != nil {
		return false, 0, err
	}
	return out.Value, out.Context.Slot, nil
}

// Slot returns the slot of the node's bank at commitment level
// (processed or confirmed), and records it as seen: the floor of a
// judgement that has asked the node nothing else with a slot yet (search),
// or that must not take an older bank's word than the tip's now
// (attributed).
func (c *RPC) Slot(ctx context.Context, level int) (uint64, error) {
	var slot uint64
	if err := c.call(ctx, "getSlot", []any{map[string]any{"commitment": commitments[level]}}, &slot); err != nil {
		return 0, err
	}
	c.saw(level, slot)
	return slot, nil
}

// ClockSysvar is the address of the Clock sysvar account: the bank's slot,
// epoch and unix_timestamp, the chain's own clock.
const ClockSysvar = "SysvarC1ock11111111111111111111111111111111"

// ChainTime returns the unix time (seconds) of the chain's own clock, the
// Clock sysvar's unix_timestamp as the confirmed bank at minSlot or later
// holds it (the clock a block's blockTime is read from), and that bank's
// slot, which it records as seen. A bank older than minSlot is an error
// (the node's -32016, or a behindError).
func (c *RPC) ChainTime(ctx context.Context, minSlot uint64) (unix int64, slot uint64, err error) {
	var out struct {
		Context rpcContext `json:"context"`
		Value   *Account   `json:"value"`
	}
	cfg := map[string]any{"encoding": "base64", "commitment": "confirmed"}
	if minSlot > 0 {
		cfg["minContextSlot"] = minSlot
	}
	if err := c.call(ctx, "getAccountInfo", []any{ClockSysvar, cfg}, &out); err != nil {
		return 0, 0, err
	}
	if err := c.atLeastSeen(confirmed, "getAccountInfo", out.Context.Slot, minSlot); err != nil {
		return 0, 0, err
	}
	if out.Value == nil || len(out.Value.Data) != 2 || out.Value.Data[1] != "base64" {
		return 0, 0, errors.New("solana rpc getAccountInfo: no Clock sysvar in base64")
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(out.Value.Data[0])
	if err != nil || len(raw) != 40 {
		return 0, 0, errors.New("solana rpc getAccountInfo: the Clock sysvar is not 40 bytes of base64")
	}
	// slot, epoch_start_timestamp, epoch, leader_schedule_epoch, then
	// unix_timestamp, each 8 bytes little-endian.
	return int64(binary.LittleEndian.Uint64(raw[32:])), out.Context.Slot, nil
}

// SignatureInfo is one getSignaturesForAddress entry.
type SignatureInfo struct {
	Signature          string          `json:"signature"`
	Slot               uint64          `json:"slot"`
	Err                json.RawMessage `json:"err"`
	BlockTime          *int64          `json:"blockTime"`
	ConfirmationStatus string          `json:"confirmationStatus"`
}

// SignaturesForAddress lists the confirmed transactions that name address
// among their accounts, newest first: at most limit (1 to 1000) of them,
// older than the transaction before ("" for the newest), as a bank at
// minSlot or later holds them (0: any; the reply carries no slot to check,
// so a node that ignores minContextSlot is taken at its word).
func (c *RPC) SignaturesForAddress(ctx context.Context, address, before string, limit int, minSlot uint64) ([]SignatureInfo, error) {
	cfg := map[string]any{"limit": limit, "commitment": "confirmed"}
	if before != "" {
		cfg["before"] = before
	}
	if minSlot > 0 {
		cfg["minContextSlot"] = minSlot
	}
	var out []SignatureInfo
	if err := c.call(ctx, "getSignaturesForAddress", []any{address, cfg}, &out); err != nil {
		return nil, err
	}
	if len(out) > limit {
		return nil, fmt.Errorf("solana rpc getSignaturesForAddress: %d entries for a limit of %d", len(out), limit)
	}
	return out, nil
}

// LandedTransaction is getTransaction's value with the base64 encoding.
type LandedTransaction struct {
	Slot      uint64 `json:"slot"`
	BlockTime *int64 `json:"blockTime"`
	Meta      *struct {
		Err json.RawMessage `json:"err"`
	} `json:"meta"`
	// Transaction is [base64 wire transaction, "base64"].
	Transaction []string `json:"transaction"`
}

// Transaction returns the confirmed transaction of signature sig, nil when
// the node does not know it.
func (c *RPC) Transaction(ctx context.Context, sig string) (*LandedTransaction, error) {
	var out *LandedTransaction
	cfg := map[string]any{"encoding": "base64", "commitment": "confirmed", "maxSupportedTransactionVersion": 0}
	err := c.call(ctx, "getTransaction", []any{sig, cfg}, &out)
	return out, err
}

// GenesisHash returns the chain's genesis hash; its first 32 characters
// are the CAIP-2 reference of the network.
func (c *RPC) GenesisHash(ctx context.Context) (string, error) {
	var h string
	err := c.call(ctx, "getGenesisHash", nil, &h)
	return h, err
}

// Account is getAccountInfo's value with the base64 encoding.
type Account struct {
	Owner string `json:"owner"`
	// Data is [base64 data, "base64"].
	Data []string `json:"data"`
}

// AccountInfo returns an account as the confirmed bank holds it, nil when
// it does not exist.
func (c *RPC) AccountInfo(ctx context.Context, address string) (*Account, error) {
	var out struct {
		Value *Account `json:"value"`
	}
	cfg := map[string]any{"encoding": "base64", "commitment": "confirmed"}
	err := c.call(ctx, "getAccountInfo", []any{address, cfg}, &out)
	return out.Value, err
}

// Balance returns the lamports an account holds as the confirmed bank
// holds it (0 when it does not exist).
func (c *RPC) Balance(ctx context.Context, address string) (uint64, error) {
	var out struct {
		Value uint64 `json:"value"`
	}
	err := c.call(ctx, "getBalance", []any{address, map[string]any{"commitment": "confirmed"}}, &out)
	return out.Value, err
}

// RentExemptMinimum returns the lamports an account of size bytes of
// data must hold to be rent-exempt.
func (c *RPC) RentExemptMinimum(ctx context.Context, size int) (uint64, error) {
	var out uint64
	err := c.call(ctx, "getMinimumBalanceForRentExemption", []any{size}, &out)
	return out, err
}
