package evmfacilitator

import (
	"context"
	"crypto/ecdsa"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/aovhq/aov/x402"
)

func TestDevAccounts(t *testing.T) {
	accts := DevAccounts()
	if len(accts) != 10 {
		t.Fatalf("got %d development accounts, want 10", len(accts))
	}
	seen := map[common.Address]bool{}
	for _, a := range accts {
		t.Run(a.Address.Hex(), func(t *testing.T) {
			got := crypto.PubkeyToAddress(a.Key().PublicKey)
			if got != a.Address {
				t.Errorf("account %d: key derives %s, documented address is %s", a.Index, got.Hex(), a.Address.Hex())
			}
			if got.Hex() != devKeys[a.Index].addr {
				t.Errorf("account %d: documented address %s is not in EIP-55 form (%s)", a.Index, devKeys[a.Index].addr, got.Hex())
			}
			if seen[got] {
				t.Errorf("account %d duplicates another account", a.Index)
			}
			seen[got] = true
		})
	}
}

// startDevnet starts a devnet for one test and closes it at the end.
func startDevnet(t testing.TB, cfg DevnetConfig) *Devnet {
	t.Helper()
	d, err := StartDevnet(cfg)
	if err != nil {
		t.Fatalf("StartDevnet: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// tokenCall calls the test token at the devnet's settled head, so that it
// sees every settlement the facilitator has reported.
func tokenCall(t testing.TB, d *Devnet, method string, args ...any) []any {
	t.Helper()
	data, err := tokenABI.Pack(method, args...)
	if err != nil {
		t.Fatal(err)
	}
	head, err := SettledHead(context.Background(), d.Client())
	if err != nil {
		t.Fatal(err)
	}
	tok := d.Token()
	out, err := d.Client().CallContract(context.Background(), ethereum.CallMsg{To: &tok, Data: data}, head)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	res, err := tokenABI.Unpack(method, out)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return res
}

func usdcBalance(t testing.TB, d *Devnet, a common.Address) *big.Int {
	t.Helper()
	return tokenCall(t, d, "balanceOf", a)[0].(*big.Int)
}

func TestDevnetFundsAccountsAndDeploysToken(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	ctx := context.Background()
	id, err := d.Client().ChainID(ctx)
	if err != nil || id.Int64() != DevnetChainID {
		t.Fatalf("chain id = %v, %v; want %d", id, err, DevnetChainID)
	}
	if want := common.HexToAddress("0x5FbDB2315678afecb367f032d93F642f64180aa3"); d.Token() != want {
		t.Errorf("token address %s, want the deployer's first contract address %s", d.Token().Hex(), want.Hex())
	}
	if got := tokenCall(t, d, "name")[0]; got != "USD Coin" {
		t.Errorf("name() = %v", got)
	}
	if got := tokenCall(t, d, "version")[0]; got != "2" {
		t.Errorf("version() = %v", got)
	}
	if got := tokenCall(t, d, "decimals")[0]; got != uint8(6) {
		t.Errorf("decimals() = %v", got)
	}
	for _, a := range DevAccounts() {
		eth, err := d.Client().BalanceAt(ctx, a.Address, nil)
		if err != nil || eth.Sign() <= 0 {
			t.Errorf("account %d ETH balance %v, %v; want funded", a.Index, eth, err)
		}
		want := int64(DevnetUSDCPerAccount)
		if a.Index == 0 {
			want = 0
		}
		if got := usdcBalance(t, d, a.Address); got.Int64() != want {
			t.Errorf("account %d holds %v test USDC units, want %d", a.Index, got, want)
		}
	}
}

// TestSettledHeadIncludesWhatHasAReceipt: once a transaction's receipt is
// readable, the settled head is at or past its block and its state shows
// the transfer. (The moment when go-ethereum shows the receipt before it
// moves latest cannot be caused on demand; SettledHead's doc comment says
// how it is told apart.)
func TestSettledHeadIncludesWhatHasAReceipt(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	ctx := context.Background()
	to := DevAccounts()[2].Address
	before := usdcBalance(t, d, to)
	data, err := tokenABI.Pack("transfer", to, big.NewInt(7))
	if err != nil {
		t.Fatal(err)
	}
	tok := d.Token()
	r, err := d.SendTx(ctx, DevKey(3), &tok, data) // returns once the receipt is readable
	if err != nil {
		t.Fatal(err)
	}
	head, err := SettledHead(ctx, d.Client())
	if err != nil {
		t.Fatal(err)
	}
	if head.Cmp(r.BlockNumber) < 0 {
		t.Fatalf("settled head %v is before the transaction's block %v", head, r.BlockNumber)
	}
	if got := new(big.Int).Sub(usdcBalance(t, d, to), before); got.Int64() != 7 {
		t.Errorf("balance at the settled head moved by %v, want 7", got)
	}
}

func TestDevnetBlockTimeFollowsWallClock(t *testing.T) {
	d := startDevnet(t, DevnetConfig{IdleBlockAfter: time.Second})
	time.Sleep(2500 * time.Millisecond)
	head, err := d.Client().HeaderByNumber(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lag := time.Since(time.Unix(int64(head.Time), 0))
	if lag < -2*time.Second || lag > 3*time.Second {
		t.Errorf("idle chain head is %v behind the wall clock; want within a few seconds", lag)
	}
}

func TestDevnetServesJSONRPCOverHTTP(t *testing.T) {
	d := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	if !strings.HasPrefix(d.RPCURL(), "http://127.0.0.1:") {
		t.Fatalf("RPCURL = %q", d.RPCURL())
	}
	c, err := ethclient.Dial(d.RPCURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id, err := c.ChainID(context.Background())
	if err != nil || id.Int64() != DevnetChainID {
		t.Fatalf("chain id over HTTP = %v, %v", id, err)
	}
	code, err := c.CodeAt(context.Background(), d.Token(), nil)
	if err != nil || len(code) == 0 {
		t.Fatalf("token code over HTTP: %d bytes, %v", len(code), err)
	}
	// Only eth, net and web3 are served; the txpool namespace stays closed.
	resp, err := http.Post(d.RPCURL(), "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"txpool_status","params":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "error") {
		t.Errorf("txpool_status over HTTP answered %s; want it not exposed", body)
	}
}

func TestTwoDevnetsRunSideBySide(t *testing.T) {
	a := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	b := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	if a.RPCURL() == b.RPCURL() {
		t.Fatal("two devnets share an RPC URL")
	}
}

// TestDevnetWritesNothingOutsideItsDataDir: a devnet without a data_dir
// makes no folder in the temp directory, so a devnet that is killed (not
// closed) leaves nothing behind. (Before: go-ethereum made an empty keystore
// folder there at every start and removed it only on a clean close.)
func TestDevnetWritesNothingOutsideItsDataDir(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	startDevnet(t, DevnetConfig{})
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("a running devnet left %s in the temp directory", e.Name())
	}
}

// TestTestUSDCRevertStrings checks the token's own EIP-3009 rules (what a
// facilitator's simulation and settlement meet on chain), by eth_call from
// the relayer.
func TestTestUSDCRevertStrings(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	nowU := time.Now().Unix()
	signed := func(mod func(*x402.Authorization), key *ecdsa.PrivateKey) (x402.AuthorizationValues, []byte) {
		a := auth(payer, req)
		if mod != nil {
			mod(&a)
		}
		if key == nil {
			key = payer
		}
		p := sign(t, key, a, req, req)
		var pl x402.ExactEVMPayload
		json.Unmarshal(p.Payload, &pl)
		v, err := a.Values()
		if err != nil {
			t.Fatal(err)
		}
		return v, common.FromHex(pl.Signature)
	}
	used, usedSig := signed(nil, nil)
	if r, err := e.f.Settle(context.Background(), payload(t, "0x"+hex.EncodeToString(usedSig), x402.Authorization{
		From: used.From.Hex(), To: used.To.Hex(), Value: used.Value.String(), ValidAfter: used.ValidAfter.String(),
		ValidBefore: used.ValidBefore.String(), Nonce: "0x" + hex.EncodeToString(used.Nonce[:])}, req), req); err != nil || !r.Success {
		t.Fatalf("settling the used authorization: %+v, %v", r, err)
	}
	stranger, _ := crypto.GenerateKey()
	cases := []struct {
		desc  string
		build func() []byte
		want  string // "" = succeeds
	}{
		{"a good authorization transfers (v,r,s overload)", func() []byte {
			v, s := signed(nil, nil)
			d, _ := transferCallData(v, s, false)
			return d
		}, ""},
		{"a good authorization transfers (bytes overload)", func() []byte {
			v, s := signed(nil, nil)
			d, _ := transferCallData(v, s, true)
			return d
		}, ""},
		{"an expired authorization reverts", func() []byte {
			v, s := signed(func(a *x402.Authorization) { a.ValidBefore = fmt.Sprint(nowU - 100) }, nil)
			d, _ := transferCallData(v, s, false)
			return d
		}, "authorization is expired"},
		{"an early authorization reverts", func() []byte {
			v, s := signed(func(a *x402.Authorization) { a.ValidAfter = fmt.Sprint(nowU + 3600) }, nil)
			d, _ := transferCallData(v, s, false)
			return d
		}, "authorization is not yet valid"},
		{"a used nonce reverts", func() []byte {
			d, _ := transferCallData(used, usedSig, false)
			return d
		}, "authorization is used or canceled"},
		{"a signature by another key reverts", func() []byte {
			v, s := signed(nil, stranger)
			d, _ := transferCallData(v, s, false)
			return d
		}, "invalid signature"},
		{"more than the balance reverts", func() []byte {
			v, s := signed(func(a *x402.Authorization) { a.Value = "1000000000001" }, nil)
			d, _ := transferCallData(v, s, false)
			return d
		}, "transfer amount exceeds balance"},
		{"receiveWithAuthorization from someone other than the payee reverts", func() []byte {
			v, s := signed(nil, nil)
			var r, ss [32]byte
			copy(r[:], s[:32])
			copy(ss[:], s[32:64])
			d, _ := tokenABI.Pack(findMethod("receiveWithAuthorization", 9), v.From, v.To, v.Value, v.ValidAfter, v.ValidBefore, v.Nonce, s[64], r, ss)
			return d
		}, "caller must be the payee"},
	}
	tok := e.d.Token()
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := e.d.Client().CallContract(context.Background(), ethereum.CallMsg{From: e.f.Relayer(), To: &tok, Data: tc.build()}, nil)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("call failed: %v", err)
				}
				return
			}
			kind, reason := classify(err)
			if kind != answerReverted || reason != tc.want {
				t.Fatalf("revert %q (answer kind %d), want %q", reason, kind, tc.want)
			}
		})
	}
}

// TestDevnetRPCAnswersLoopbackPagesOnly: the devnet's JSON-RPC lets a web
// page on a loopback origin (any port) call it from a browser, answering
// its preflight and its calls with Access-Control-Allow-Origin, and gives
// pages of any other site, look-alike names included, no CORS answer. No
// account is unlocked on the node, so a page it answers holds no key it
// did not have.
func TestDevnetRPCAnswersLoopbackPagesOnly(t *testing.T) {
	d := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	do := func(method, origin, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, d.RPCURL(), strings.NewReader(body))
		req.Header.Set("Origin", origin)
		if method == http.MethodOptions {
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "content-type")
		} else {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	const chainID = `{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}`
	for _, origin := range []string{"http://localhost:8080", "http://127.0.0.1:5173", "http://[::1]:3000", "http://localhost"} {
		pre := do(http.MethodOptions, origin, "")
		if got := pre.Header.Get("Access-Control-Allow-Origin"); got != origin || pre.StatusCode >= 300 {
			t.Errorf("preflight from %s: status %d, Access-Control-Allow-Origin %q", origin, pre.StatusCode, got)
		}
		if got := pre.Header.Get("Access-Control-Allow-Headers"); !strings.EqualFold(got, "content-type") {
			t.Errorf("preflight from %s: Access-Control-Allow-Headers %q", origin, got)
		}
		resp := do(http.MethodPost, origin, chainID)
		body, _ := io.ReadAll(resp.Body)
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != origin || !strings.Contains(string(body), `"0x539"`) {
			t.Errorf("eth_chainId from %s: Access-Control-Allow-Origin %q, body %s", origin, got, body)
		}
	}
	for _, origin := range []string{"https://shop.example", "http://127.0.0.1.shop.example", "http://localhost.shop.example:8080", "https://localhost:8080", "null"} {
		for _, method := range []string{http.MethodOptions, http.MethodPost} {
			if got := do(method, origin, chainID).Header.Get("Access-Control-Allow-Origin"); got != "" {
				t.Errorf("%s from %s: Access-Control-Allow-Origin %q, want none", method, origin, got)
			}
		}
	}
	resp := do(http.MethodPost, "http://localhost:8080", `{"jsonrpc":"2.0","id":1,"method":"eth_accounts","params":[]}`)
	if body, _ := io.ReadAll(resp.Body); !strings.Contains(string(body), `"result":[]`) {
		t.Errorf("eth_accounts: %s, want no unlocked account", body)
	}
}

// TestDevnetRPCRefusesOtherHostNames: a request whose Host is another name
// (what a DNS-rebinding page sends) is refused; localhost and IP addresses
// are answered.
func TestDevnetRPCRefusesOtherHostNames(t *testing.T) {
	d := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(d.RPCURL(), "http://"))
	const chainID = `{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}`
	for host, want := range map[string]int{
		"localhost:" + port:           http.StatusOK,
		"127.0.0.1:" + port:           http.StatusOK,
		"rebind.shop.example:" + port: http.StatusForbidden,
		"localhost.shop.example":      http.StatusForbidden,
	} {
		req, _ := http.NewRequest(http.MethodPost, d.RPCURL(), strings.NewReader(chainID))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: status %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// TestDevnetNoncesFollowTheDevnet: every devnet has chain ID 1337, but each
// is a chain of its own (its genesis differs), with nonce managers of its
// own, whether it starts beside another (as tests do) or after the others
// closed, so none takes another's nonces. A stale nonce ahead of the chain
// would leave the settlement queued, never mined.
func TestDevnetNoncesFollowTheDevnet(t *testing.T) {
	settle := func(t *testing.T, d *Devnet, f *Facilitator) {
		t.Helper()
		req := (&testEnv{d: d}).requirements(payee, amount)
		if r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req); err != nil || !r.Success {
			t.Fatalf("settle = %+v, %v", r, err)
		}
	}
	newFac := func(t *testing.T, d *Devnet) *Facilitator {
		t.Helper()
		f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		identified(t, f)
		return f
	}

	a, err := StartDevnet(DevnetConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	fa := newFac(t, a)
	for range 3 {
		settle(t, a, fa) // account 0's nonce on a runs ahead of a fresh chain's
	}

	t.Run("a devnet beside another has nonces of its own", func(t *testing.T) {
		b := startDevnet(t, DevnetConfig{})
		fb := newFac(t, b)
		if fb.nonces == fa.nonces {
			t.Fatal("the relayer's nonce manager on b is a's")
		}
		settle(t, b, fb)
		settle(t, a, fa)
	})
	t.Run("a devnet started after the others closed has nonces of its own", func(t *testing.T) {
		a.Close()
		c := startDevnet(t, DevnetConfig{})
		fc := newFac(t, c)
		if fc.nonces == fa.nonces {
			t.Error("the relayer's nonce manager on the new devnet is the closed one's")
		}
		settle(t, c, fc)
		cf, err := c.NewFacilitator()
		if err != nil {
			t.Fatal(err)
		}
		settle(t, c, cf)
		if cf.nonces != fc.nonces {
			t.Error("the devnet's facilitator and one pointed at its chain have two nonce managers")
		}
	})
}
