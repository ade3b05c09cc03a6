package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"

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
	return info
}

// cleanAgent accepts an agent_id as the gateway forwards it: UTF-8, at most
// 200 characters (SPEC §3's limit), no control characters; anything else is
// dropped.
func cleanAgent(v string) string {
	if v == "" || !utf8.ValidString(v) || utf8.RuneCountInString(v) > 200 {
		return ""
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return ""
		}
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

// boundToWallet reports whether agentID is bound to the wallet the caller
// proved control of: the agent_id the proof itself named (X-Wallet-Auth's
// agent_id claim, forwarded as X-Aov-Wallet-Agent), or the address itself,
// or a CAIP-10 account id ending in it (eip155:8453:0xabc...). EVM (0x)
// addresses compare case-insensitively, since EIP-55 checksum casing is
// only a display form; others (Solana's base58) exactly. Only such an
// agent's history counts as authenticated.
func boundToWallet(agentID, wallet, walletAgent string) bool {
	if agentID == "" || wallet == "" {
		return false
	}
	if walletAgent != "" && agentID == walletAgent {
		return true
	}
	if i := strings.LastIndexByte(agentID, ':'); i >= 0 {
		agentID = agentID[i+1:]
	}
	if strings.HasPrefix(wallet, "0x") || strings.HasPrefix(wallet, "0X") {
		return strings.EqualFold(agentID, wallet)
	}
	return agentID == wallet
}
