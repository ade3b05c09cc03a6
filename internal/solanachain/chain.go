// Package solanachain starts the local Solana chain of interop/
// (solana-chain.mjs: litesvm behind a loopback JSON-RPC) for a test, and
// offers the test helpers it serves: token balances, SOL, new mints and
// blockhash expiry.
package solanachain

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/interop"
)

// USDC is the devnet USDC mint the chain creates (6 decimals, SPL Token).
const USDC = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU"

// Wallet is a funded development wallet (10 SOL, 1,000 USDC). Its key is
// public: development only.
type Wallet struct {
	Address   string `json:"address"`
	SecretKey string `json:"secretKey"` // base58 of the 64-byte secret key
	SeedHex   string `json:"seedHex"`
}

// Chain is a running local chain.
type Chain struct {
	URL     string   `json:"url"`
	Wallets []Wallet `json:"wallets"`
	// FeePayer is the development fee payer the chain funds (100 SOL).
	FeePayer string `json:"feePayer"`
	t        testing.TB
}

// Start runs a fresh chain on a free loopback port for the length of t,
// with 100 SOL in each of fundSOL (fee payers). It is skipped (failed under
// CI) without node or the npm peers.
func Start(t testing.TB, fundSOL ...string) *Chain {
	t.Helper()
	interop.Dir(t, "litesvm")
	c := &Chain{t: t}
	interop.Start(t, "solana-chain.mjs", []string{"PORT=0", "FUND_SOL=" + strings.Join(fundSOL, ",")}, c)
	return c
}

// Call calls a JSON-RPC method and decodes its result into out.
func (c *Chain) Call(method string, out any, params ...any) {
	c.t.Helper()
	if params == nil {
		params = []any{}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	resp, err := http.Post(c.URL, "application/json", bytes.NewReader(body))
	if err != nil {
		c.t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var env struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil || env.Error != nil {
		c.t.Fatalf("%s: %s", method, b)
	}
	if out != nil {
		if err := json.Unmarshal(env.Result, out); err != nil {
			c.t.Fatalf("%s result %s: %v", method, env.Result, err)
		}
	}
}

// SetTokenBalance gives owner's associated token account of mint (under
// tokenProgram, "" for SPL Token) exactly amount, creating it, and returns
// the account's address.
func (c *Chain) SetTokenBalance(owner, mint string, amount uint64, tokenProgram string) string {
	c.t.Helper()
	var ata string
	params := []any{owner, mint, fmt.Sprint(amount)}
	if tokenProgram != "" {
		params = append(params, tokenProgram)
	}
	c.Call("aov_setTokenBalance", &ata, params...)
	return ata
}

// TokenBalance returns the amount in a token account, or -1 when the
// account does not exist.
func (c *Chain) TokenBalance(account string) int64 {
	c.t.Helper()
	var info struct {
		Value *struct {
			Data json.RawMessage `json:"data"`
		} `json:"value"`
	}
	c.Call("getAccountInfo", &info, account, map[string]string{"encoding": "jsonParsed"})
	if info.Value == nil {
		return -1
	}
	var parsed struct {
		Parsed struct {
			Info struct {
				TokenAmount struct {
					Amount string `json:"amount"`
				} `json:"tokenAmount"`
			} `json:"info"`
		} `json:"parsed"`
	}
	if err := json.Unmarshal(info.Value.Data, &parsed); err != nil {
		c.t.Fatalf("%s is not a token account: %s", account, info.Value.Data)
	}
	var n int64
	fmt.Sscan(parsed.Parsed.Info.TokenAmount.Amount, &n)
	return n
}

// Lamports returns an account's SOL balance in lamports.
func (c *Chain) Lamports(account string) uint64 {
	c.t.Helper()
	var out struct {
		Value uint64 `json:"value"`
	}
	c.Call("getBalance", &out, account)
	return out.Value
}

// CreateMint creates a mint with no authority at address.
func (c *Chain) CreateMint(address string, decimals int, tokenProgram string) {
	c.t.Helper()
	c.Call("aov_createMint", nil, address, decimals, tokenProgram)
}

// SetAccount writes an account owned by owner holding data (rent-exempt):
// a mint or token account with Token-2022 extensions, say.
func (c *Chain) SetAccount(address, owner string, data []byte) {
	c.t.Helper()
	c.Call("aov_setAccount", nil, address, owner, base64.StdEncoding.EncodeToString(data))
}

// Airdrop adds lamports to an account.
func (c *Chain) Airdrop(address string, lamports uint64) {
	c.t.Helper()
	c.Call("aov_airdrop", nil, address, lamports)
}

// LatestBlockhash returns the blockhash new transactions use.
func (c *Chain) LatestBlockhash() string {
	c.t.Helper()
	var out struct {
		Value struct {
			Blockhash string `json:"blockhash"`
		} `json:"value"`
	}
	c.Call("getLatestBlockhash", &out)
	return out.Value.Blockhash
}

// ExpireBlockhash makes every blockhash handed out so far invalid.
func (c *Chain) ExpireBlockhash() {
	c.t.Helper()
	c.Call("aov_expireBlockhash", nil)
}

// AdvanceClock moves the chain's clock (its Clock sysvar and the blockTime
// of the transactions that land from then on) d ahead, whole seconds, as
// if the chain had run that much longer than the wall clock says.
func (c *Chain) AdvanceClock(d time.Duration) {
	c.t.Helper()
	c.Call("aov_advanceClock", nil, int64(d/time.Second))
}
