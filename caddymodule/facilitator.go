package caddymodule

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/caddyopt"
	"github.com/aovhq/aov/internal/inflight"
	"github.com/aovhq/aov/internal/secretopt"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

func init() {
	caddy.RegisterModule(EVMFacilitator{})
	caddy.RegisterModule(HTTPFacilitator{})
	caddy.RegisterModule(FacilitatorHandler{})
	httpcaddyfile.RegisterHandlerDirective("x402_facilitator", parseFacilitatorHandler)
	httpcaddyfile.RegisterDirectiveOrder("x402_facilitator", httpcaddyfile.Before, "respond")
}

// facilitatorPool shares EVM facilitators (and the devnets under them)
// between configurations: Caddy provisions a new config before it cleans up
// the old one, and a devnet must not be started twice. (A relayer's nonce
// sequence is shared by evmfacilitator itself, also between facilitators
// this pool keeps apart, such as two rpc_url of one relayer.) Keyed by
// EVMFacilitator.poolKey.
var facilitatorPool = caddy.NewUsagePool()

// facilitatorDevnetKeyPrefix starts the facilitatorPool keys of devnets.
const facilitatorDevnetKeyPrefix = "devnet rpc_listen="

// pooledFacilitator is a facilitatorPool entry.
type pooledFacilitator struct {
	f      *evmfacilitator.Facilitator
	devnet *evmfacilitator.Devnet // nil unless the facilitator runs on a devnet
	client *settlementChain       // nil on a devnet
}

// Destruct closes the facilitator, whose pending settlements the newest
// facilitator of the relayer key on its chain still loaded takes over
// (Facilitator.Close: Caddy provisions a reloaded config before it cleans
// up the old one), then the devnet or the chain connection it would read
// through.
func (p *pooledFacilitator) Destruct() error {
	if p.f != nil {
		p.f.Close()
	}
	if p.client != nil {
		p.client.Close()
	}
	if p.devnet != nil {
		return p.devnet.Close()
	}
	return nil
}

// FacilitatorDevnet asks for an in-process development chain (chain id
// 1337) with a test USDC token deployed and the ten development accounts
// of the "test test … junk" mnemonic funded. For development and tests
// only: its state is lost on exit and every key on it is public.
type FacilitatorDevnet struct {
	// RPCListen serves the chain's JSON-RPC over HTTP on this address
	// (e.g. 127.0.0.1:8545) for wallets, viem or other facilitators. Empty:
	// the chain is reachable inside the process only.
	RPCListen string `json:"rpc_listen,omitempty"`
	// DataDir keeps the chain (blocks, balances, nonces, contracts) in this
	// folder, so it survives a restart of Caddy, even a crash. Empty: the
	// chain lives in memory and is lost on exit.
	DataDir string `json:"data_dir,omitempty"`
}

// EVMFacilitator is a facilitator that verifies and settles x402 "exact"
// payments (EIP-3009) itself, on one EVM chain, submitting settlements from
// a relayer key it holds and pays gas with. Either Devnet is set (a local
// development chain) or RPCURL, Network and a relayer key are.
//
// Module ID: x402.facilitators.evm
type EVMFacilitator struct {
	// Network is the chain, as a CAIP-2 id ("eip155:84532") or a known name
	// ("base", "base-sepolia", "devnet"). Required with rpc_url; with
	// devnet it can only be devnet.
	Network string `json:"network,omitempty"`
	// RPCURL is the chain's JSON-RPC endpoint (http, https, ws or wss).
	RPCURL string `json:"rpc_url,omitempty"`
	// RelayerKeyFile is a file holding the relayer's hex private key. The
	// relayer's address must hold ETH for gas.
	RelayerKeyFile string `json:"relayer_key_file,omitempty"`
	// RelayerKey is the relayer's hex private key; use a placeholder such
	// as {env.AOV_RELAYER_KEY} rather than writing the key in the config,
	// whose JSON Caddy serves and saves (a literal is warned about,
	// secretopt).
	RelayerKey string `json:"relayer_key,omitempty"`
	// ReceiptTimeout bounds the wait for a settlement's receipt; after it
	// the outcome is read from the token. Default 2m.
	ReceiptTimeout caddy.Duration `json:"receipt_timeout,omitempty"`
	// The failure budget: a settlement that reverts on chain costs the
	// relayer its gas, and a payer can make its own revert at will.
	// MaxFailedPerPayer reverted settlements of one payer within
	// FailureWindow refuse its payments (default 3 in 1h);
	// MaxInFlightPerPayer caps its settlements awaiting their outcome
	// (default 16).
	MaxFailedPerPayer   int            `json:"max_failed_per_payer,omitempty"`
	MaxInFlightPerPayer int            `json:"max_in_flight_per_payer,omitempty"`
	FailureWindow       caddy.Duration `json:"failure_window,omitempty"`
	// MaxSettlementGas is the most gas one settlement may cost the
	// relayer (default 500000, at least evmfacilitator.MinSettlementGas,
	// what an ordinary account's first payment to a payee needs with its
	// gas limit's headroom): a payer whose account has code runs it inside
	// the settlement, and a
	// payment needing more is refused at verify and settle, nothing sent.
	MaxSettlementGas uint64 `json:"max_settlement_gas,omitempty"`
	// Devnet runs the facilitator on an in-process development chain whose
	// relayer is development account 0.
	Devnet *FacilitatorDevnet `json:"devnet,omitempty"`

	poolKey string
	f       *evmfacilitator.Facilitator
	uses    *inflight.Config
}

// checkSettlementGas refuses a max_settlement_gas below what an ordinary
// account's transferWithAuthorization to a new payee needs with its gas
// limit's headroom (evmfacilitator.New refuses it too, without the
// option's name): under it such payments would be refused.
func checkSettlementGas(gas uint64) error {
	if gas < evmfacilitator.MinSettlementGas {
		return fmt.Errorf("max_settlement_gas %d is below %d, what an ordinary account's transferWithAuthorization to a new payee needs with its gas limit's headroom: such payments would be refused", gas, evmfacilitator.MinSettlementGas)
	}
	return nil
}

// UnmarshalJSON decodes the JSON config as Caddy does, and refuses a
// failure budget written as 0 or less, and a failure_window that is not
// positive (refuseWrittenZero): a written "max_failed_per_payer": 0 (an
// operator allowing no reverted settlement) would otherwise read as the
// default, 3.
func (m *EVMFacilitator) UnmarshalJSON(b []byte) error {
	type plain EVMFacilitator // without this method
	return refuseWrittenZero(b, (*plain)(m), "evm facilitator", "failure_window")
}

// CaddyModule returns the Caddy module information.
func (EVMFacilitator) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.evm", New: func() caddy.Module { return new(EVMFacilitator) }}
}

// Provision gets the shared facilitator for this configuration, starting
// a devnet or dialing the RPC endpoint the first time.
func (m *EVMFacilitator) Provision(ctx caddy.Context) error {
	m.uses = inflight.For(ctx)
	repl := caddy.NewReplacer()
	if m.Devnet != nil {
		if m.Network != "" {
			if n, err := x402.ResolveNetwork(m.Network); err != nil || n != evmfacilitator.DevnetNetwork {
				return fmt.Errorf("devnet runs on %s, not %q", evmfacilitator.DevnetNetwork, m.Network)
			}
		}
		if m.RPCURL != "" || m.RelayerKey != "" || m.RelayerKeyFile != "" {
			return errors.New("devnet brings its own chain and relayer: drop rpc_url and relayer_key(_file)")
		}
		if m.MaxFailedPerPayer != 0 || m.MaxInFlightPerPayer != 0 || m.FailureWindow != 0 || m.MaxSettlementGas != 0 {
			// One devnet per process, shared by every config that names it.
			return errors.New("devnet settles with the default failure budget and gas ceiling: drop max_failed_per_payer, max_in_flight_per_payer, failure_window and max_settlement_gas")
		}
		listen := repl.ReplaceKnown(m.Devnet.RPCListen, "")
		dataDir := repl.ReplaceKnown(m.Devnet.DataDir, "")
		key := facilitatorDevnetKeyPrefix + listen
		if dataDir != "" {
			key += " data_dir=" + dataDir
		}
		// One devnet per process: the x402 asset registry holds one devnet
		// token, and two chains behind one network id would disagree.
		var other string
		found := false
		facilitatorPool.Range(func(k, _ any) bool {
			if ks, _ := k.(string); strings.HasPrefix(ks, facilitatorDevnetKeyPrefix) && ks != key {
				other, found = strings.TrimPrefix(ks, facilitatorDevnetKeyPrefix), true
			}
			return !found
		})
		if found {
			return fmt.Errorf("a devnet with rpc_listen %q is already running in this process; every devnet setting must be the same (rpc_listen %q here); to change it, restart", other, listen)
		}
		m.poolKey = key
		val, _, err := facilitatorPool.LoadOrNew(m.poolKey, func() (caddy.Destructor, error) {
			d, err := evmfacilitator.StartDevnet(evmfacilitator.DevnetConfig{RPCListen: listen, DataDir: dataDir})
			if err != nil {
				return nil, err
			}
			f, err := d.NewFacilitator()
			if err != nil {
				d.Close()
				return nil, err
			}
			ctx.Logger().Info("devnet started", zap.String("rpc_url", d.RPCURL()), zap.String("token", d.Token().Hex()),
				zap.String("relayer", f.Relayer().Hex()))
			return &pooledFacilitator{f: f, devnet: d}, nil
		})
		if err != nil {
			return fmt.Errorf("starting devnet: %v", err)
		}
		m.f = val.(*pooledFacilitator).f
		return nil
	}

	if m.RPCURL == "" {
		return errors.New("rpc_url is required (or use devnet)")
	}
	if m.MaxSettlementGas != 0 {
		if err := checkSettlementGas(m.MaxSettlementGas); err != nil {
			return err
		}
	}
	if m.Network == "" {
		return errors.New("network is required with rpc_url")
	}
	network, err := x402.ResolveNetwork(m.Network)
	if err != nil {
		return fmt.Errorf("network: %v", err)
	}
	key, err := m.relayerKey(repl, ctx.Logger())
	if err != nil {
		return err
	}
	rpcURL := repl.ReplaceKnown(m.RPCURL, "")
	secretopt.WarnIfURLCredentials(ctx.Logger(), "rpc_url", m.RPCURL, rpcURL)
	relayer := crypto.PubkeyToAddress(key.PublicKey)
	m.poolKey = fmt.Sprintf("rpc network=%s url=%s relayer=%s timeout=%d budget=%d/%d/%d gas=%d", network, rpcURL, relayer.Hex(), m.ReceiptTimeout,
		m.MaxFailedPerPayer, m.MaxInFlightPerPayer, m.FailureWindow, m.MaxSettlementGas)
	val, _, err := facilitatorPool.LoadOrNew(m.poolKey, func() (caddy.Destructor, error) {
		// Dialing an http(s) endpoint makes no request; a ws(s) one
		// connects here. New reads the chain's genesis block, which tells
		// it from other chains of its chain ID, in the background: a node
		// that does not answer neither holds nor fails the load.
		c, err := dialSettlementChain(context.Background(), rpcURL, rpcDialTimeout)
		if err != nil {
			return nil, fmt.Errorf("rpc_url: %v", secretopt.Scrub(err, rpcURL))
		}
		f, err := evmfacilitator.New(evmfacilitator.Config{Chain: c, Network: network, RelayerKey: key, ReceiptTimeout: time.Duration(m.ReceiptTimeout),
			MaxFailedPerPayer: m.MaxFailedPerPayer, MaxInFlightPerPayer: m.MaxInFlightPerPayer, FailureWindow: time.Duration(m.FailureWindow),
			MaxSettlementGas: m.MaxSettlementGas})
		if err != nil {
			c.Close()
			return nil, err
		}
		return &pooledFacilitator{f: f, client: c}, nil
	})
	if err != nil {
		return err
	}
	m.f = val.(*pooledFacilitator).f
	return nil
}

// rpcDialTimeout bounds the connection to a ws(s) rpc_url when the config
// loads: a node that accepts and never answers must fail the load, not
// hold it. (A var for the tests.)
var rpcDialTimeout = 10 * time.Second

// relayerKey reads the relayer key from relayer_key or relayer_key_file,
// warning on log when relayer_key is the key itself (secretopt).
func (m *EVMFacilitator) relayerKey(repl *caddy.Replacer, log *zap.Logger) (*ecdsa.PrivateKey, error) {
	hexKey := repl.ReplaceKnown(m.RelayerKey, "")
	secretopt.WarnIfLiteral(log, "relayer_key", m.RelayerKey, hexKey)
	switch {
	case hexKey != "" && m.RelayerKeyFile != "":
		return nil, errors.New("set relayer_key or relayer_key_file, not both")
	case m.RelayerKeyFile != "":
		b, err := os.ReadFile(repl.ReplaceKnown(m.RelayerKeyFile, ""))
		if err != nil {
			return nil, fmt.Errorf("reading relayer_key_file: %v", err)
		}
		hexKey = string(b)
	case hexKey == "":
		return nil, errors.New("relayer_key or relayer_key_file is required with rpc_url")
	}
	key, err := crypto.HexToECDSA(strings.TrimPrefix(strings.TrimSpace(hexKey), "0x"))
	if err != nil {
		return nil, errors.New("the relayer key is not a hex secp256k1 private key") // never echo the key
	}
	return key, nil
}

// Cleanup releases this configuration's use of the shared facilitator once
// its requests in flight are done (a payment being settled still needs the
// chain); the last user stops the devnet or closes the connection.
func (m *EVMFacilitator) Cleanup() error { return releasePooled(m.uses, &m.poolKey, nil) }

// releasePooled gives a facilitator module's use of its facilitatorPool
// entry (*key, then "") back once uses's requests in flight are done, and
// then runs then (nil for nothing): the last use's Delete closes the
// facilitator (Destruct) before then runs. With no entry (a Provision that
// failed before it), then runs at once.
func releasePooled(uses *inflight.Config, key *string, then func() error) error {
	if then == nil {
		then = func() error { return nil }
	}
	k := *key
	if k == "" {
		return then()
	}
	*key = ""
	return uses.AfterRequests(func() error {
		_, err := facilitatorPool.Delete(k)
		return errors.Join(err, then())
	})
}

// Verify implements x402.Facilitator.
func (m *EVMFacilitator) Verify(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.VerifyResponse, error) {
	return m.f.Verify(ctx, p, req)
}

// Settle implements x402.Facilitator.
func (m *EVMFacilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	return m.f.Settle(ctx, p, req)
}

// callTimeouts implements timedFacilitator: the embedded facilitator's
// own bounds, receipt_timeout included.
func (m *EVMFacilitator) callTimeouts() (verify, settle time.Duration) { return m.f.Timeouts() }

// Supported implements x402.Facilitator.
func (m *EVMFacilitator) Supported(ctx context.Context) (x402.SupportedResponse, error) {
	return m.f.Supported(ctx)
}

// UnmarshalCaddyfile sets up the module from Caddyfile tokens:
//
//	evm {
//		network          <name|caip2>
//		rpc_url          <url>
//		relayer_key_file <path>
//		relayer_key      <hex|{env.VAR}>
//		receipt_timeout  <duration>
//		max_failed_per_payer    <n>
//		max_in_flight_per_payer <n>
//		failure_window          <duration>
//		max_settlement_gas      <n>
//		devnet [{
//			rpc_listen <host:port>
//			data_dir   [<path>]
//		}]
//	}
func (m *EVMFacilitator) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := caddyopt.Once{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Check(d); err != nil {
			return err // every evm option takes one value
		}
		var err error
		switch d.Val() {
		case "network":
			err = facOneArg(d, &m.Network)
		case "rpc_url":
			err = facOneArg(d, &m.RPCURL)
		case "relayer_key_file":
			err = facOneArg(d, &m.RelayerKeyFile)
		case "relayer_key":
			err = facOneArg(d, &m.RelayerKey)
		case "receipt_timeout":
			err = facDurationArg(d, &m.ReceiptTimeout)
		case "max_failed_per_payer":
			err = facPositive(d, &m.MaxFailedPerPayer)
		case "max_in_flight_per_payer":
			err = facPositive(d, &m.MaxInFlightPerPayer)
		case "failure_window":
			if err = facDurationArg(d, &m.FailureWindow); err == nil && m.FailureWindow <= 0 {
				err = errors.New("must be positive")
			}
		case "max_settlement_gas":
			if err = facPositive(d, &m.MaxSettlementGas); err == nil {
				err = checkSettlementGas(m.MaxSettlementGas)
			}
		case "devnet":
			m.Devnet, err = facParseDevnet(d)
		default:
			return d.Errf("unrecognized evm facilitator option '%s'", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// facParseDevnet parses `devnet [{ rpc_listen <addr>; data_dir [<path>] }]`.
func facParseDevnet(d *caddyfile.Dispenser) (*FacilitatorDevnet, error) {
	dn := new(FacilitatorDevnet)
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	seen := caddyopt.Once{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Check(d); err != nil {
			return nil, err
		}
		switch d.Val() {
		case "rpc_listen":
			if err := facOneArg(d, &dn.RPCListen); err != nil {
				return nil, err
			}
		case "data_dir":
			// No path (an empty environment variable) keeps the chain in
			// memory.
			if d.NextArg() {
				dn.DataDir = d.Val()
			}
			if d.NextArg() {
				return nil, d.ArgErr()
			}
		default:
			return nil, d.Errf("unrecognized devnet option '%s'", d.Val())
		}
	}
	return dn, nil
}

// HTTPFacilitator is a remote facilitator reached over the x402
// facilitator HTTP API (POST /verify, POST /settle, GET /supported), such as
// https://x402.org/facilitator or another instance of x402_facilitator.
//
// Module ID: x402.facilitators.http
type HTTPFacilitator struct {
	// URL is the facilitator's base URL; /verify, /settle and /supported
	// are appended to it.
	URL string `json:"url,omitempty"`
	// Headers are sent with every request, e.g. an Authorization header.
	// Values may use placeholders such as {env.FACILITATOR_TOKEN}.
	Headers map[string]string `json:"headers,omitempty"`
	// Timeout bounds one call, retries included. Default 30s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// RPC maps a network to a chain JSON-RPC endpoint the gate reads to
	// resolve a settlement whose outcome this facilitator could not tell
	// (remotestatus.go). Values may use placeholders.
	RPC map[string]string `json:"rpc,omitempty"`

	f      *x402.HTTPFacilitator
	status remoteStatus // remotestatus.go
	uses   *inflight.Config
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (HTTPFacilitator) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.http", New: func() caddy.Module { return new(HTTPFacilitator) }}
}

// credentialHeader reports whether a header of the http facilitator
// carries a credential, whose value is warned about when written in the
// config (secretopt). Other headers are not secrets and may be literals.
func credentialHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Authorization", "Proxy-Authorization", "X-Api-Key":
		return true
	}
	return false
}

// Provision builds the client; a bad URL is refused here.
func (m *HTTPFacilitator) Provision(ctx caddy.Context) error {
	m.uses = inflight.For(ctx)
	m.logger = ctx.Logger()
	repl := caddy.NewReplacer()
	headers := make(map[string]string, len(m.Headers))
	for k, v := range m.Headers {
		headers[k] = repl.ReplaceKnown(v, "")
		if credentialHeader(k) {
			secretopt.WarnIfLiteral(ctx.Logger(), "header "+k, v, headers[k])
		}
	}
	url := repl.ReplaceKnown(m.URL, "")
	secretopt.WarnIfURLCredentials(ctx.Logger(), "url", m.URL, url)
	m.f = x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: url, Headers: headers, Timeout: time.Duration(m.Timeout)})
	if err := m.f.Err(); err != nil {
		return err
	}
	if err := m.provisionStatus(repl, ctx.Logger()); err != nil { // remotestatus.go
		return err
	}
	return nil
}

// warnUnreadableWaits has each remote facilitator a gate settles offers
// through, f itself or a member of f, warn of the offers it cannot read
// past the gate's wait (warnUnreadableWait). A multi's members warn only
// of the offers no member reads (readsSettlements, by memberReads: the
// rule its status questions follow), as any other's outcome is read by a
// sibling.
func warnUnreadableWaits(f x402.Facilitator, offers []x402.PaymentRequirements) {
	switch f := f.(type) {
	case *HTTPFacilitator:
		f.warnUnreadableWait(offers)
	case *MultiFacilitator:
		var unread []x402.PaymentRequirements
		for _, o := range offers {
			if !f.readsSettlements(context.Background(), o) {
				unread = append(unread, o)
			}
		}
		for _, member := range f.fs {
			warnUnreadableWaits(member, unread)
		}
	}
}

// warnUnreadableWait logs a Warning when m, a facilitator of a gate
// offering offers, may answer a settle after the gate stopped waiting (its
// timeout is above maxFacilitatorWait) and has no rpc for an offer's
// network (readsSettlements): every settle on it that takes between the
// two is then held 503 settlement_pending for 7 days and never resolved,
// although it may have moved the money. The networks are the gate's, as
// rpc for another network reads none of its payments. The config still
// loads: a remote whose settles are fast never gets there.
func (m *HTTPFacilitator) warnUnreadableWait(offers []x402.PaymentRequirements) {
	if m.f.Timeout() <= maxFacilitatorWait {
		return
	}
	var unread []string
	for _, o := range offers {
		if !m.readsSettlements(context.Background(), o) && !slices.Contains(unread, o.Network) {
			unread = append(unread, o.Network)
		}
	}
	if len(unread) == 0 {
		return
	}
	m.logger.Warn(fmt.Sprintf("timeout above the gate's %v wait without rpc: a settlement still running when the gate stops waiting is answered settlement_pending and, with nothing to read its chain, held unresolved for 7 days although it may have moved the money; add rpc <network> <url> for each network it settles, or a timeout of at most %v", maxFacilitatorWait, maxFacilitatorWait),
		zap.Duration("timeout", m.f.Timeout()), zap.Strings("networks", unread))
}

// Verify implements x402.Facilitator.
func (m *HTTPFacilitator) Verify(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.VerifyResponse, error) {
	return m.f.Verify(ctx, p, req)
}

// Settle implements x402.Facilitator.
func (m *HTTPFacilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	return m.f.Settle(ctx, p, req)
}

// callTimeouts implements timedFacilitator: the block's timeout bounds
// either call, retries included.
func (m *HTTPFacilitator) callTimeouts() (verify, settle time.Duration) {
	return m.f.Timeout(), m.f.Timeout()
}

// Supported implements x402.Facilitator.
func (m *HTTPFacilitator) Supported(ctx context.Context) (x402.SupportedResponse, error) {
	return m.f.Supported(ctx)
}

// UnmarshalCaddyfile sets up the module from Caddyfile tokens:
//
//	http [<url>] {
//		url     <url>
//		header  <name> <value>
//		timeout <duration>
//		rpc     <network> <rpc-url>   # repeatable; see remotestatus.go
//	}
func (m *HTTPFacilitator) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	seen := caddyopt.Once{}
	if d.NextArg() {
		m.URL = d.Val()
		seen["url"] = true
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "url", "timeout":
			if err := seen.Check(d); err != nil {
				return err
			}
		}
		switch d.Val() {
		case "url":
			err = facOneArg(d, &m.URL)
		case "header":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.ArgErr()
			}
			if _, dup := m.Headers[args[0]]; dup {
				return d.Errf("header %s given twice: a second would silently replace the first", args[0])
			}
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			m.Headers[args[0]] = args[1]
		case "timeout":
			err = facDurationArg(d, &m.Timeout)
		case "rpc":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.ArgErr()
			}
			if _, dup := m.RPC[args[0]]; dup {
				return d.Errf("rpc %s given twice: a second would silently replace the first", args[0])
			}
			if m.RPC == nil {
				m.RPC = map[string]string{}
			}
			m.RPC[args[0]] = args[1]
		default:
			return d.Errf("unrecognized http facilitator option '%s'", d.Val())
		}
		if err != nil {
			return err
		}
	}
	if m.URL == "" {
		return d.Err("the http facilitator needs a url")
	}
	return nil
}

// FacilitatorHandler serves the x402 facilitator HTTP API, backed by a
// facilitator module: POST verify, POST settle, GET supported and GET
// discovery/resources at the request path's end (/verify, /settle,
// /supported, /discovery/resources), answering the reference facilitators'
// JSON. The discovery list (x402's bazaar) holds the resources it settled
// a payment for, kept in a store (Discovery, StoreRaw). Mount it under a
// prefix, e.g.:
//
//	handle_path /facilitator/* {
//		x402_facilitator {
//			devnet
//		}
//	}
//
// Other paths answer 404. It is a terminal handler: it never calls the next
// one.
//
// A facilitator submits settlements from its relayer and pays their gas,
// so a public one would pay for anyone's transfers to anyone. This one
// verifies and settles only payments to the operator's own addresses
// (PayTo, required), in the network's USDC, of at least MinPrice: any
// other is refused with isValid/success false and reason
// invalid_payment_requirements, before the chain is asked. With
// Token set, every request must also carry Authorization: Bearer <token>,
// or it is refused with 401.
//
// Module ID: http.handlers.x402_facilitator
type FacilitatorHandler struct {
	// FacilitatorRaw is the facilitator that does the work (a module in the
	// x402.facilitators namespace: evm, http).
	FacilitatorRaw json.RawMessage `json:"facilitator,omitempty" caddy:"namespace=x402.facilitators inline_key=type"`

	// PayTo lists the only recipients (payTo) this API verifies and
	// settles payments to: the operator's own addresses, as in the x402
	// gate's accept lines. Required. Placeholders such as {env.PAY_TO} are
	// expanded once.
	PayTo []string `json:"pay_to,omitempty"`

	// MinPrice is the smallest payment this API verifies or settles, in
	// the network's USDC ("$0.01", the default), read in the token's own
	// decimals (minAtoms): a floor the token of a network the facilitator
	// settles on cannot express refuses the config. The caller writes the
	// requirements it asks to settle, and every settlement costs the
	// relayer or fee payer its gas or fee: without a floor, anyone could
	// have the operator pay for a stream of one-atom payments to the
	// operator's own address.
	MinPrice string `json:"min_price,omitempty"`

	// Token, when set, is the bearer token every request must carry
	// (Authorization: Bearer <token>); use a placeholder such as
	// {env.AOV_FACILITATOR_TOKEN} rather than writing it in the config. A
	// gate reaches such a facilitator with `facilitator http { header
	// Authorization "Bearer {env.AOV_FACILITATOR_TOKEN}" }`.
	Token string `json:"token,omitempty"`

	// StoreRaw keeps the bazaar discovery list (a module in the
	// x402.stores namespace: badger, redis). Default: Badger under Caddy's
	// data directory, the gate's default store, so the list survives
	// reloads and restarts; with redis, every instance lists the same
	// resources.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=x402.stores inline_key=type"`
	// Discovery bounds the discovery list or turns it off.
	Discovery *FacilitatorDiscovery `json:"discovery,omitempty"`

	api   http.Handler
	token [32]byte // SHA-256 of the token, compared in constant time
	gated bool
	uses  *inflight.Config // internal/inflight
}

// CaddyModule returns the Caddy module information.
func (FacilitatorHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.x402_facilitator", New: func() caddy.Module { return new(FacilitatorHandler) }}
}

// Provision loads the store (its discovery list), then the facilitator
// module: a facilitator without a store of its own (svm) joins the default
// folder as the handler's store opened it (its no_sync).
func (h *FacilitatorHandler) Provision(ctx caddy.Context) error {
	h.uses = inflight.For(ctx)
	if h.FacilitatorRaw == nil {
		return errors.New("x402_facilitator needs a facilitator (devnet, evm or http)")
	}
	repl := caddy.NewReplacer()
	if h.Token != "" {
		tok := repl.ReplaceKnown(h.Token, "")
		secretopt.WarnIfLiteral(ctx.Logger(), "token", h.Token, tok)
		if len(tok) < 16 {
			return errors.New("x402_facilitator: token must be at least 16 characters")
		}
		h.token, h.gated = sha256.Sum256([]byte(tok)), true
	}
	cfg, err := h.discoveryConfig(ctx) // which callers it lists needs the token
	if err != nil {
		return err
	}
	mod, err := ctx.LoadModule(h, "FacilitatorRaw")
	if err != nil {
		return fmt.Errorf("loading facilitator module: %v", err)
	}
	f, ok := mod.(x402.Facilitator)
	if !ok {
		return fmt.Errorf("facilitator module %T does not verify and settle payments", mod)
	}
	guard := &payToGuard{Facilitator: f}
	settled, _ := settledNetworks(f)
	for _, a := range h.PayTo {
		a = strings.TrimSpace(repl.ReplaceKnown(a, ""))
		if a == "" || strings.ContainsAny(a, " \t{}") {
			return fmt.Errorf("x402_facilitator: pay_to %q is not an address", a)
		}
		// The list spans networks: an address is checked against the zero
		// address of either form, and against the USDC of every network
		// known to be settled here (a remote facilitator's are not known).
		if err := x402.CheckPayTo("", a, ""); err != nil {
			return fmt.Errorf("x402_facilitator: pay_to: %v", err)
		}
		for _, n := range settled {
			if usdc, ok := x402.USDC(n); ok {
				if err := x402.CheckPayTo("", a, usdc.Address); err != nil {
					return fmt.Errorf("x402_facilitator: pay_to: %v", err)
				}
			}
		}
		guard.payTo = append(guard.payTo, a)
	}
	if len(guard.payTo) == 0 {
		return errors.New("x402_facilitator: pay_to is required: the addresses this facilitator settles payments to (your own), so it never pays gas for anyone else's transfers")
	}
	guard.minPrice = h.MinPrice
	if guard.minPrice == "" {
		guard.minPrice = defaultFacilitatorMinPrice
	}
	if err := guard.checkMinPrice(settled); err != nil {
		return fmt.Errorf("x402_facilitator: min_price: %v", err)
	}
	h.api = x402.NewFacilitatorHandlerWith(guard, cfg)
	return nil
}

// defaultFacilitatorMinPrice is MinPrice's default.
const defaultFacilitatorMinPrice = "$0.01"

// payToGuard refuses, before its facilitator sees them, payments that are
// not the operator's to take: to anyone but the operator, in anything but
// the network's USDC, or below MinPrice. The caller writes the
// requirements: a payTo check alone let anyone have the operator's fee
// payer settle one atom of a mint they made themselves, to the operator's
// address, as often as they liked.
type payToGuard struct {
	x402.Facilitator
	payTo    []string
	minPrice string
}

// refusal is why the guard refuses req ("" when it does not).
func (g *payToGuard) refusal(req x402.PaymentRequirements) string {
	if !g.ours(req.PayTo) {
		return foreignPayTo
	}
	a, ok := x402.LookupAsset(req.Network, req.Asset)
	if !ok {
		return "this facilitator settles its network's USDC only"
	}
	least, err := minAtoms(g.minPrice, a)
	if err != nil {
		// Only an asset unknown at provision (a remote facilitator's)
		// gets here: the operator's floor cannot be stated in it (too
		// fine for its decimals, or too large for uint256).
		return fmt.Sprintf("this facilitator's min_price %s cannot be stated in the %d decimals of %s; it settles no payment in it", g.minPrice, a.Decimals, assetName(a))
	}
	amount, ok := new(big.Int).SetString(req.Amount, 10)
	if !ok || amount.Cmp(least) < 0 {
		return "this facilitator settles payments of at least " + g.minPrice + " only"
	}
	return ""
}

// minAtoms is the floor min_price sets in atomic units of a: the one rule
// by which Provision checks min_price and every request is compared with
// it. The price is read in a's own decimals, as a gate's accept price is,
// and a floor finer than a can express is an error, never rounded.
func minAtoms(minPrice string, a x402.Asset) (*big.Int, error) {
	atoms, err := x402.ParsePrice(minPrice, a.Decimals)
	if err != nil {
		return nil, err
	}
	n, _ := new(big.Int).SetString(atoms, 10) // ParsePrice returns a canonical integer
	return n, nil
}

// checkMinPrice refuses a min_price that is not a price, or that cannot be
// stated in the asset of one of networks (those the facilitator settles
// on that are known at provision): such a floor would refuse every payment
// in that asset. The networks of a remote facilitator are not known here;
// a request in an asset too coarse for the floor is refused saying so.
func (g *payToGuard) checkMinPrice(networks []string) error {
	// The form, whatever the asset: read in as many decimals as it writes
	// (at most an asset's 77), so that only the form can fail here.
	_, frac, _ := strings.Cut(g.minPrice, ".")
	if _, err := x402.ParsePrice(g.minPrice, min(len(frac), 77)); err != nil {
		return err
	}
	for _, n := range networks {
		a, ok := x402.USDC(n)
		if !ok {
			continue
		}
		if _, err := minAtoms(g.minPrice, a); err != nil {
			return fmt.Errorf("%v (%s)", err, assetName(a))
		}
	}
	return nil
}

// assetName names a's token in messages.
func assetName(a x402.Asset) string { return "the token of " + a.Network }

// settledNetworks lists the networks f settles on by itself, as known at
// provision: an evm or svm facilitator's own, a multi's of its members.
// complete reports that f settles on these and no others. A remote (http)
// facilitator's, or any other module's, are its own to say, over the
// network, and are not asked for here: a multi with such a member may
// settle on more.
func settledNetworks(f x402.Facilitator) (networks []string, complete bool) {
	switch m := f.(type) {
	case *EVMFacilitator:
		return []string{m.f.Network()}, true
	case *SVMFacilitator:
		return []string{m.f.Network()}, true
	case *MultiFacilitator:
		complete = true
		for _, member := range m.fs {
			n, c := settledNetworks(member)
			networks, complete = append(networks, n...), complete && c
		}
		return networks, complete
	}
	return nil, false
}

// ours reports whether payTo is one of the operator's addresses: 0x
// addresses compare without regard to case, others exactly.
func (g *payToGuard) ours(payTo string) bool {
	for _, a := range g.payTo {
		if a == payTo || (common.IsHexAddress(a) && common.IsHexAddress(payTo) && strings.HasPrefix(payTo, "0x") &&
			common.HexToAddress(a) == common.HexToAddress(payTo)) {
			return true
		}
	}
	return false
}

const foreignPayTo = "this facilitator settles payments to its operator's addresses only"

// Verify implements x402.Facilitator.
func (g *payToGuard) Verify(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.VerifyResponse, error) {
	if why := g.refusal(req); why != "" {
		return x402.VerifyResponse{IsValid: false, InvalidReason: x402.ReasonInvalidPaymentRequirements, InvalidMessage: why}, nil
	}
	return g.Facilitator.Verify(ctx, p, req)
}

// Settle implements x402.Facilitator.
func (g *payToGuard) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	if why := g.refusal(req); why != "" {
		return x402.SettleResponse{Success: false, ErrorReason: x402.ReasonInvalidPaymentRequirements, ErrorMessage: why,
			Network: req.Network}, nil
	}
	return g.Facilitator.Settle(ctx, p, req)
}

// authorized checks the bearer token, when one is configured, in constant
// time over fixed-length hashes.
func (h *FacilitatorHandler) authorized(r *http.Request) bool {
	if !h.gated {
		return true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || len(r.Header.Values("Authorization")) != 1 {
		return false
	}
	got := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(got[:], h.token[:]) == 1
}

// ServeHTTP answers the facilitator API. A path ending in /verify,
// /settle or /supported is that endpoint, whatever prefix precedes it, so
// the handler also works under a matcher without handle_path.
func (h *FacilitatorHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	r = atEndpoint(r)
	// Before the facilitator or the discovery store is used: see
	// Gate.ServeHTTP.
	if !h.uses.Enter() {
		if r.URL.Path == "/settle" && h.authorized(r) {
			// Nothing was sent: the facilitator never ran. A 503 would
			// read to a remote gate as an unknown outcome, holding a
			// payment never sent; the settle shape says nothing was
			// settled, as the facilitator API says it for any settle
			// that sent nothing.
			unloadedAPI.ServeHTTP(w, r)
			return nil
		}
		apierr.Write(w, apierr.Unavailable("payment facilitator", 1, errUnloaded))
		return nil
	}
	defer h.uses.Leave()
	if !h.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="x402 facilitator"`)
		apierr.Write(w, apierr.Unauthorized("the facilitator's bearer token is missing or wrong"))
		return nil
	}
	h.api.ServeHTTP(w, r)
	return nil
}

// atEndpoint is r at its endpoint's own path when its path ends in one
// after a prefix, r itself otherwise.
func atEndpoint(r *http.Request) *http.Request {
	for _, ep := range facilitatorEndpoints {
		if p := r.URL.Path; p != ep && strings.HasSuffix(p, ep) {
			r2 := new(http.Request)
			*r2 = *r
			u := *r.URL
			u.Path, u.RawPath = ep, ""
			r2.URL = &u
			return r2
		}
	}
	return r
}

var facilitatorEndpoints = []string{"/verify", "/settle", "/supported", "/discovery/resources"}

// unloadedAPI answers a /settle that reached a configuration already
// unloaded: the facilitator API's own reading of the request (400 for a
// malformed one) and its answer to a settle that sent nothing
// (facilitator_unavailable, naming the payment's network and payer).
var unloadedAPI = x402.NewFacilitatorHandler(unloadedFacilitator{})

// unloadedFacilitator is the facilitator of a configuration already
// unloaded: it does nothing, and says so with errUnloaded.
type unloadedFacilitator struct{}

func (unloadedFacilitator) Verify(context.Context, x402.PaymentPayload, x402.PaymentRequirements) (x402.VerifyResponse, error) {
	return x402.VerifyResponse{}, errUnloaded
}

func (unloadedFacilitator) Settle(context.Context, x402.PaymentPayload, x402.PaymentRequirements) (x402.SettleResponse, error) {
	return x402.SettleResponse{}, errUnloaded
}

func (unloadedFacilitator) Supported(context.Context) (x402.SupportedResponse, error) {
	return x402.SupportedResponse{}, errUnloaded
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	x402_facilitator {
//		pay_to <address> [<address> ...]     # required: the only recipients settled
//		min_price <price>                     # the smallest payment settled (default $0.01)
//		token  <secret|{env.VAR}>             # optional: require Authorization: Bearer
//		store  <module> { … }                 # the discovery list's store (default badger)
//		discovery off | {                     # the discovery list's bounds
//			max_entries <n>; max_entry_bytes <size>; max_age <duration>
//			origins <scheme://host[:port]>...
//			list_unauthenticated_settles      # without a token: list what any settle describes
//		}
//		devnet [{ rpc_listen <host:port> }]   # shorthand for evm { devnet … }
//		evm { … }                             # or any x402.facilitators module
//		http <url> { … }
//	}
func (h *FacilitatorHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := caddyopt.Once{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		switch name {
		case "token", "min_price", "store", "discovery":
			if err := seen.Check(d); err != nil {
				return err
			}
		}
		switch name {
		case "pay_to":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			h.PayTo = append(h.PayTo, args...)
			continue
		case "token":
			if err := facOneArg(d, &h.Token); err != nil {
				return err
			}
			continue
		case "min_price":
			if err := facOneArg(d, &h.MinPrice); err != nil {
				return err
			}
			continue
		case "store":
			raw, err := guestModule(d, "x402.stores")
			if err != nil {
				return err
			}
			h.StoreRaw = raw
			continue
		case "discovery":
			fd, err := parseFacilitatorDiscovery(d)
			if err != nil {
				return err
			}
			h.Discovery = fd
			continue
		}
		if h.FacilitatorRaw != nil {
			return d.Err("x402_facilitator takes one facilitator")
		}
		if name == "devnet" {
			dn, err := facParseDevnet(d)
			if err != nil {
				return err
			}
			h.FacilitatorRaw = caddyconfig.JSONModuleObject(EVMFacilitator{Devnet: dn}, "type", "evm", nil)
			continue
		}
		if _, err := caddy.GetModule("x402.facilitators." + name); err != nil {
			return d.Errf("unrecognized x402_facilitator option '%s' (want devnet, evm or http)", name)
		}
		unm, err := caddyfile.UnmarshalModule(d, "x402.facilitators."+name)
		if err != nil {
			return err
		}
		h.FacilitatorRaw = caddyconfig.JSONModuleObject(unm, "type", name, nil)
	}
	if h.FacilitatorRaw == nil {
		return d.Err("x402_facilitator needs a facilitator (devnet, evm or http)")
	}
	return nil
}

func parseFacilitatorHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(FacilitatorHandler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

func facOneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

func facDurationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	var s string
	if err := facOneArg(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("bad duration %q: %v", s, err)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*EVMFacilitator)(nil)
	_ caddy.CleanerUpper          = (*EVMFacilitator)(nil)
	_ caddyfile.Unmarshaler       = (*EVMFacilitator)(nil)
	_ x402.Facilitator            = (*EVMFacilitator)(nil)
	_ caddy.Provisioner           = (*HTTPFacilitator)(nil)
	_ caddyfile.Unmarshaler       = (*HTTPFacilitator)(nil)
	_ x402.Facilitator            = (*HTTPFacilitator)(nil)
	_ caddy.Provisioner           = (*FacilitatorHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*FacilitatorHandler)(nil)
	_ caddyfile.Unmarshaler       = (*FacilitatorHandler)(nil)
	_ caddy.Destructor            = (*pooledFacilitator)(nil)
)
