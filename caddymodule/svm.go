package caddymodule

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/caddyopt"
	"github.com/aovhq/aov/internal/inflight"
	"github.com/aovhq/aov/internal/secretopt"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

func init() {
	caddy.RegisterModule(SVMFacilitator{})
	caddy.RegisterModule(MultiFacilitator{})
}

// SVMFacilitator is a facilitator that verifies and settles x402 "exact"
// payments on Solana itself (SPL Token and Token-2022 TransferChecked),
// co-signing every payment with a fee-payer key it holds: the fee payer
// pays the transaction fees, about 0.00001 SOL per payment.
//
// Module ID: x402.facilitators.svm
type SVMFacilitator struct {
	// Network is the chain: solana, solana-devnet or a solana CAIP-2 id.
	Network string `json:"network,omitempty"`
	// RPCURL is the chain's JSON-RPC endpoint (http or https).
	RPCURL string `json:"rpc_url,omitempty"`
	// FeePayerKeyFile holds the fee payer's secret key, as solana-keygen
	// writes it (a JSON array of 64 bytes) or as base58. The file must be
	// readable by its owner only (mode 0600), and the account must hold
	// SOL.
	FeePayerKeyFile string `json:"fee_payer_key_file,omitempty"`
	// DevFeePayer uses the development fee payer instead of a key file: a
	// public key (anyone can compute it) that the local chain funds. Only
	// on solana-devnet; for development and tests.
	DevFeePayer bool `json:"dev_fee_payer,omitempty"`
	// ConfirmTimeout bounds the wait for a settlement's confirmation; after
	// it the outcome is reported as pending, never as a failure. Default
	// 30s.
	ConfirmTimeout caddy.Duration `json:"confirm_timeout,omitempty"`
	// MaxComputeUnits caps a payment's compute unit limit (default 50000)
	// and MaxComputeUnitPrice its price in micro-lamports per unit (default
	// 5000000): together they bound the priority fee the fee payer pays.
	// Each is at least 1 (UnmarshalJSON): 0 would read as the default.
	MaxComputeUnits     uint32 `json:"max_compute_units,omitempty"`
	MaxComputeUnitPrice uint64 `json:"max_compute_unit_price,omitempty"`
	// The failure budgets: a settlement that simulated and then failed on
	// chain still cost the fee payer its fee, and a payer can make its own
	// fail at will. MaxFailedPerPayer failures of one payer within
	// FailureWindow refuse its payments (default 3 in 1h);
	// MaxInFlightPerPayer caps its settlements awaiting confirmation
	// (default 16); once failures within the window cost MaxFailedLamports
	// (default 5000000, 0.005 SOL), payments asking for a priority fee
	// above MaxPriorityFeePastBudget lamports (default 5000) are refused,
	// so that each further failure costs the fee payer about what the
	// payer spends on making it fail. Kept in memory, per process (and
	// across reloads with the same settings and store).
	MaxFailedPerPayer        int            `json:"max_failed_per_payer,omitempty"`
	MaxInFlightPerPayer      int            `json:"max_in_flight_per_payer,omitempty"`
	MaxFailedLamports        uint64         `json:"max_failed_lamports,omitempty"`
	MaxPriorityFeePastBudget uint64         `json:"max_priority_fee_past_budget,omitempty"`
	FailureWindow            caddy.Duration `json:"failure_window,omitempty"`
	// StoreRaw remembers the transactions this facilitator sent, from
	// before each send until it can no longer land
	// (svmfacilitator.Config.Sent): a module in the x402.stores namespace
	// (badger, redis). Default: Badger under Caddy's data directory, the
	// gate's default folder, joined as the modules naming it opened it
	// (their no_sync), so that a replay after a restart is refused as
	// duplicate_settlement whatever the RPC node it asks knows yet; with a
	// store every instance with this fee payer shares (redis), two of them
	// never both send one payment.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=x402.stores inline_key=type"`

	poolKey string
	// defaultStore is the store without a store line (Provision), this
	// module's to clean up: no LoadModule made it.
	defaultStore *BadgerStore
	pooled       *pooledSVM
	f            *svmfacilitator.Facilitator
	uses         *inflight.Config
	// releaseStore gives back the hold on the store module of the store
	// line (storeHolder), once the facilitator's Close returned.
	releaseStore func() error
}

// storeHolder is a store module whose close can wait past its Cleanup
// (inflight.Holds): Caddy cleans up the store of an svm block's store line
// on its own, in no set order with the svm module, and the facilitator's
// sends and the drops of their records run until its Close, after the
// config's requests. A store module without it is closed when Caddy
// cleans it up.
type storeHolder interface {
	Hold() (release func() error)
}

// pooledSVM is a facilitatorPool entry: shared across config reloads so a
// reload never forgets which messages were settled. Its key holds the
// store's identity (storeIdentity): blocks with different stores never
// share one, so each block's sends are recorded in the store it names. It
// owns no handle of that store: each module provisioned on it hands it its
// own (handles, in provisioning order), and the facilitator uses the
// latest one still loaded. All are handles of one store, so which one is
// used loses no record; what matters is that it is open. A reload
// provisions the new config before the old one is cleaned up, so the new
// config's handle (a new Redis client after a password rotation) takes
// over; a reload that fails cleans up its own modules, which hands the
// running config's handle back before the failed one is closed.
type pooledSVM struct {
	f      *svmfacilitator.Facilitator
	mu     sync.Mutex
	stores []svmStoreUse
}

// svmStoreUse is one provisioned module's store handle in a pooledSVM.
type svmStoreUse struct {
	m    *SVMFacilitator
	sent svmfacilitator.SentStore
}

// use makes m's handle, sent, the facilitator's until m is cleaned up.
func (p *pooledSVM) use(m *SVMFacilitator, sent svmfacilitator.SentStore) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stores = append(p.stores, svmStoreUse{m, sent})
	p.f.UseSent(sent)
}

// leave drops m's handle and gives the facilitator the latest one still
// loaded (none left: the facilitator is about to be dropped too).
func (p *pooledSVM) leave(m *SVMFacilitator) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stores = slices.DeleteFunc(p.stores, func(u svmStoreUse) bool { return u.m == m })
	if n := len(p.stores); n > 0 {
		p.f.UseSent(p.stores[n-1].sent)
	}
}

// Destruct stops the facilitator's background polling of its pending
// sends (svmfacilitator.Facilitator.Close): once the last config using it
// is unloaded, it would poll through an rpc_url no config names any more
// and write through a store handle its config closed. A retry of such a
// send reaches the facilitator of the config now running, which answers
// it from the send's record. The RPC client holds no connection of its
// own.
func (p *pooledSVM) Destruct() error { return p.f.Close() }

// CaddyModule returns the Caddy module information.
func (SVMFacilitator) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.svm", New: func() caddy.Module { return new(SVMFacilitator) }}
}

// Provision reads the fee payer key and gets the shared facilitator. It
// makes no network call.
func (m *SVMFacilitator) Provision(ctx caddy.Context) error {
	m.uses = inflight.For(ctx)
	repl := caddy.NewReplacer()
	if m.Network == "" || m.RPCURL == "" || (m.FeePayerKeyFile == "") == !m.DevFeePayer {
		return errors.New("svm facilitator: network, rpc_url and one of fee_payer_key_file or dev_fee_payer are required")
	}
	network, err := x402.ResolveNetwork(m.Network)
	if err != nil || !x402.IsSolana(network) {
		return fmt.Errorf("svm facilitator: network %q is not a Solana network", m.Network)
	}
	key := svmfacilitator.DevFeePayer()
	if m.DevFeePayer {
		if network != x402.NetworkSolanaDevnet {
			return errors.New("svm facilitator: dev_fee_payer is a public key, allowed on solana-devnet only")
		}
		ctx.Logger().Warn("svm facilitator uses the public development fee payer: development only", zap.String("fee_payer", base58.Encode(key.Public().(ed25519.PublicKey))))
	} else if key, err = svmfacilitator.ReadKeyFile(repl.ReplaceKnown(m.FeePayerKeyFile, "")); err != nil {
		return fmt.Errorf("svm facilitator: %v", err)
	}
	rpcURL := repl.ReplaceKnown(m.RPCURL, "")
	secretopt.WarnIfURLCredentials(ctx.Logger(), "rpc_url", m.RPCURL, rpcURL)
	var st interface{ Claims() store.Claims }
	storeConfig := string(m.StoreRaw) // LoadModule drops it
	if m.StoreRaw == nil {
		// The gate's default folder, as the modules naming it opened it:
		// a store line the operator never wrote must not have a config
		// whose gate says `store badger { no_sync }` refused.
		m.defaultStore = &BadgerStore{asOpen: true}
		if err := m.defaultStore.Provision(ctx); err != nil {
			m.defaultStore = nil
			return fmt.Errorf("svm facilitator: default store: %v", err)
		}
		st = m.defaultStore
	} else {
		mod, err := ctx.LoadModule(m, "StoreRaw")
		if err != nil {
			return fmt.Errorf("svm facilitator: loading store module: %v", err)
		}
		if h, ok := mod.(storeHolder); ok {
			m.releaseStore = h.Hold()
		}
		var ok bool
		if st, ok = mod.(interface{ Claims() store.Claims }); !ok {
			return fmt.Errorf("svm facilitator: store module %T keeps no claims", mod)
		}
	}
	sent, ok := st.Claims().(svmfacilitator.SentStore)
	if !ok {
		return fmt.Errorf("svm facilitator: store module %T keeps no records of sends", st)
	}
	cfg := svmfacilitator.Config{
		RPC: &svmfacilitator.RPC{URL: rpcURL}, Network: network, FeePayer: key,
		ConfirmTimeout: time.Duration(m.ConfirmTimeout), MaxComputeUnits: m.MaxComputeUnits, MaxComputeUnitPrice: m.MaxComputeUnitPrice,
		MaxFailedPerPayer: m.MaxFailedPerPayer, MaxInFlightPerPayer: m.MaxInFlightPerPayer, MaxFailedLamports: m.MaxFailedLamports,
		MaxPriorityFeePastBudget: m.MaxPriorityFeePastBudget, FailureWindow: time.Duration(m.FailureWindow),
		Sent: sent,
	}
	f, err := svmfacilitator.New(cfg)
	if err != nil {
		return secretopt.Scrub(err, rpcURL)
	}
	// The store is part of the key by its identity, as its placeholders
	// ({env.*}, {file.*}) expanded at this load (its JSON keeps them
	// unexpanded): blocks naming different stores never share a
	// facilitator, whose records would land in the other's store, while a
	// reload naming the same store keeps the facilitator (its budgets) and
	// hands it this config's handle (pooledSVM.use), never a closed one.
	// Its JSON is part of the key too: blocks naming one store with other
	// options (a Redis store's wait_replicas) each write through a handle
	// with their own, never through the other's.
	m.poolKey = fmt.Sprintf("svm network=%s url=%s fee_payer=%s timeout=%d units=%d price=%d failed=%d inflight=%d lamports=%d priority=%d window=%d store=%q store_config=%q",
		network, rpcURL, f.FeePayer(), m.ConfirmTimeout, m.MaxComputeUnits, m.MaxComputeUnitPrice, m.MaxFailedPerPayer, m.MaxInFlightPerPayer, m.MaxFailedLamports, m.MaxPriorityFeePastBudget, m.FailureWindow, storeIdentity(st), storeConfig)
	val, _, err := facilitatorPool.LoadOrNew(m.poolKey, func() (caddy.Destructor, error) { return &pooledSVM{f: f}, nil })
	if err != nil {
		return err
	}
	m.pooled = val.(*pooledSVM)
	m.pooled.use(m, cfg.Sent)
	m.f = m.pooled.f
	return nil
}

// Cleanup hands the shared facilitator back the store handle of the
// latest config still loaded, at once (this config's handle closes once
// its requests in flight are done, and those then write through the handle
// taking over, to the same store), and releases this config's use of the
// facilitator once those requests are done, and then its hold on the
// store: the last config's release closes the facilitator (Destruct),
// which waits for its sends and their drops, before the handle they write
// through can close.
func (m *SVMFacilitator) Cleanup() error {
	if m.pooled != nil {
		m.pooled.leave(m)
	}
	release := m.releaseStore
	m.releaseStore = nil
	err := releasePooled(m.uses, &m.poolKey, release)
	if m.defaultStore != nil {
		err = errors.Join(err, m.defaultStore.Cleanup())
		m.defaultStore = nil
	}
	return err
}

// Verify implements x402.Facilitator.
func (m *SVMFacilitator) Verify(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.VerifyResponse, error) {
	return m.f.Verify(ctx, p, req)
}

// Settle implements x402.Facilitator.
func (m *SVMFacilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	return m.f.Settle(ctx, p, req)
}

// Supported implements x402.Facilitator.
func (m *SVMFacilitator) Supported(ctx context.Context) (x402.SupportedResponse, error) {
	return m.f.Supported(ctx)
}

// UnmarshalCaddyfile sets up the module from Caddyfile tokens:
//
//	svm {
//		network                <solana|solana-devnet|caip2>
//		rpc_url                <url>
//		fee_payer_key_file     <path>
//		dev_fee_payer          # instead of the key file, on solana-devnet only
//		confirm_timeout        <duration>
//		max_compute_units      <n>
//		max_compute_unit_price <micro-lamports>
//		max_failed_per_payer         <n>
//		max_in_flight_per_payer      <n>
//		max_failed_lamports          <lamports>
//		max_priority_fee_past_budget <lamports>
//		failure_window               <duration>
//		store <module> { … }         # where sent transactions are remembered (default badger)
//	}
func (m *SVMFacilitator) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := caddyopt.Once{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Check(d); err != nil {
			return err
		}
		var err error
		name := d.Val() // d.Val() moves on to the argument
		switch name {
		case "network":
			err = facOneArg(d, &m.Network)
		case "rpc_url":
			err = facOneArg(d, &m.RPCURL)
		case "fee_payer_key_file":
			err = facOneArg(d, &m.FeePayerKeyFile)
		case "dev_fee_payer":
			if d.NextArg() {
				return d.ArgErr()
			}
			m.DevFeePayer = true
		case "confirm_timeout":
			err = facDurationArg(d, &m.ConfirmTimeout)
		case "max_compute_units":
			err = facPositive(d, &m.MaxComputeUnits)
		case "max_compute_unit_price":
			err = facPositive(d, &m.MaxComputeUnitPrice)
		case "max_failed_per_payer":
			err = facPositive(d, &m.MaxFailedPerPayer)
		case "max_in_flight_per_payer":
			err = facPositive(d, &m.MaxInFlightPerPayer)
		case "max_failed_lamports":
			err = facPositive(d, &m.MaxFailedLamports)
		case "max_priority_fee_past_budget":
			err = facPositive(d, &m.MaxPriorityFeePastBudget)
		case "failure_window":
			if err = facDurationArg(d, &m.FailureWindow); err == nil && m.FailureWindow <= 0 {
				err = errors.New("must be positive")
			}
		case "store":
			m.StoreRaw, err = guestModule(d, "x402.stores")
		default:
			return d.Errf("unrecognized svm facilitator option '%s'", name)
		}
		if err != nil {
			return d.Errf("%s: %v", name, err)
		}
	}
	return nil
}

// UnmarshalJSON decodes the JSON config as Caddy does, and refuses a
// count, cap or budget written as 0 or less, and a failure_window that is
// not positive (refuseWrittenZero): a written "max_compute_unit_price": 0
// (an operator refusing priority fees) would otherwise read as the largest
// default, 5,000,000 micro-lamports per unit.
func (m *SVMFacilitator) UnmarshalJSON(b []byte) error {
	type plain SVMFacilitator // without this method
	return refuseWrittenZero(b, (*plain)(m), "svm facilitator", "failure_window")
}

// refuseWrittenZero decodes a facilitator's JSON config into v (a pointer
// to its struct) as Caddy does, then refuses every integer field (a count,
// a cap or a budget) that the JSON gives and that decoded to 0 or less,
// and every duration named in positive (as the Caddyfile refuses them) that
// decoded to 0 or less. Those fields read 0 as "the default", so a written
// 0 would ask for the opposite of what it says; leaving a field out, or
// writing null (which encoding/json leaves the field alone for), is how the
// default is asked for. A member gives a field as encoding/json decodes it:
// its name equal to the field's under Unicode case folding; of several,
// the last stands, so the decoded value is judged, and the field counts as
// given when any of them is not null. The error names the field by its
// documented name, never as written.
func refuseWrittenZero(b []byte, v any, module string, positive ...string) error {
	if err := caddy.StrictUnmarshalJSON(b, v); err != nil {
		return err
	}
	given, err := givenMembers(b)
	if err != nil {
		return err
	}
	rv := reflect.ValueOf(v).Elem()
	for i := range rv.NumField() {
		f, fv := rv.Type().Field(i), rv.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" || !slices.ContainsFunc(given, func(g string) bool { return strings.EqualFold(g, name) }) {
			continue
		}
		switch k := f.Type.Kind(); {
		case f.Type == reflect.TypeFor[caddy.Duration]():
			if slices.Contains(positive, name) && fv.Int() <= 0 {
				return fmt.Errorf("%s: %s must be a positive duration (leave it out for the default)", module, name)
			}
		case (k == reflect.Int && fv.Int() < 1) || ((k == reflect.Uint32 || k == reflect.Uint64) && fv.Uint() == 0):
			return fmt.Errorf("%s: %s must be a whole number of at least 1 (leave it out for the default)", module, name)
		}
	}
	return nil
}

// givenMembers lists the names of the members of the JSON object b whose
// value is not null, as written.
func givenMembers(b []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("the config is not a JSON object")
	}
	var names []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		if string(raw) != "null" {
			names = append(names, t.(string))
		}
	}
	return names, nil
}

// facPositive reads one argument, a plain decimal of at least 1 that fits
// dst (a count, a cap or lamports): 0 would read as "the default" in the
// JSON config, so it is not accepted here (UnmarshalJSON refuses it there),
// and neither is a sign.
func facPositive[T int | uint32 | uint64](d *caddyfile.Dispenser, dst *T) error {
	var s string
	if err := facOneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.ParseUint(s, 10, 64)
	// T(n) < 1: a uint64 past math.MaxInt wraps to a negative int.
	if err != nil || n < 1 || uint64(T(n)) != n || T(n) < 1 {
		return errors.New("must be a whole number of at least 1")
	}
	*dst = T(n)
	return nil
}

// MultiFacilitator sends each payment to the first of its facilitators
// that supports the payment's scheme and network (from their /supported,
// remembered for five minutes), so one route can offer Base and Solana side
// by side. Its /supported is the union of theirs. A facilitator whose
// /supported failed is skipped for a while (multiRetryFirst, doubling up
// to multiRetryMax while it keeps failing): asked again for every payment,
// a remote that hangs would make every payment for a later member wait
// out its timeout first. Each ask is bounded (multiAskTimeout), so a
// remote that hangs leaves the later members, and the verify or settle,
// the rest of the caller's time.
//
// Module ID: x402.facilitators.multi
type MultiFacilitator struct {
	FacilitatorsRaw []json.RawMessage `json:"facilitators,omitempty" caddy:"namespace=x402.facilitators inline_key=type"`

	fs []x402.Facilitator
	mu *sync.Mutex
	// supported[i] is fs[i]'s last successful /supported answer.
	supported []x402.SupportedResponse
	at        []time.Time
	// failed[i] is fs[i]'s last failed /supported, since its last success.
	failed []multiFailure
}

// multiFailure is a member's failed /supported: its error, the backoff it
// started, and when the member may be asked again.
type multiFailure struct {
	err   error
	wait  time.Duration
	until time.Time
}

// CaddyModule returns the Caddy module information.
func (MultiFacilitator) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.multi", New: func() caddy.Module { return new(MultiFacilitator) }}
}

// Provision loads the facilitators.
func (m *MultiFacilitator) Provision(ctx caddy.Context) error {
	if len(m.FacilitatorsRaw) == 0 {
		return errors.New("multi facilitator: at least one facilitator is required")
	}
	mods, err := ctx.LoadModule(m, "FacilitatorsRaw")
	if err != nil {
		return fmt.Errorf("loading facilitators: %v", err)
	}
	for _, mod := range mods.([]any) {
		f, ok := mod.(x402.Facilitator)
		if !ok {
			return fmt.Errorf("facilitator module %T does not verify and settle payments", mod)
		}
		m.fs = append(m.fs, f)
	}
	m.ready()
	return nil
}

// ready makes the remembered state of m's facilitators, fs.
func (m *MultiFacilitator) ready() {
	m.mu = new(sync.Mutex)
	m.supported = make([]x402.SupportedResponse, len(m.fs))
	m.at = make([]time.Time, len(m.fs))
	m.failed = make([]multiFailure, len(m.fs))
}

const (
	multiSupportedTTL = 5 * time.Minute
	// A member whose /supported failed is not asked again for
	// multiRetryFirst, then twice as long after each further failure, up
	// to multiRetryMax: a remote back up is used again within a minute,
	// and one that hangs costs one payment its timeout per minute, not
	// every payment.
	multiRetryFirst = 2 * time.Second
	multiRetryMax   = time.Minute
)

// multiAskTimeout bounds one member's /supported ask, and so does half the
// caller's time left: a remote that hangs (until its own timeout, 30 s by
// default, as long as the gate's whole verify or settle) then costs a
// payment at most this, and the next member, and the verify or settle of
// the member picked, still have time. A variable for tests.
var multiAskTimeout = 5 * time.Second

// kinds returns fs[i]'s /supported: the remembered answer while it is
// fresh, no answer while a failure's backoff lasts, else the member's
// answer (asked within ask's bound), remembered either way. A failure the
// caller caused says nothing of the member and starts no backoff: its
// context ended (the client left, or its deadline passed), or the ask ran
// out of a bound the caller's deadline had cut below half of
// multiAskTimeout. Else a later, healthy member asked after an earlier one
// spent the caller's time would be backed off too.
func (m *MultiFacilitator) kinds(ctx context.Context, i int) (x402.SupportedResponse, error) {
	t := now()
	m.mu.Lock()
	s, at, failed := m.supported[i], m.at[i], m.failed[i]
	m.mu.Unlock()
	if !at.IsZero() && t.Sub(at) >= 0 && t.Sub(at) < multiSupportedTTL {
		return s, nil
	}
	if failed.err != nil && t.Before(failed.until) {
		return x402.SupportedResponse{}, fmt.Errorf("%w (not asked again until %s)", failed.err, failed.until.UTC().Format(time.RFC3339))
	}
	askCtx, cancel, cut := ask(ctx)
	s, err := m.fs[i].Supported(askCtx)
	byCaller := ctx.Err() != nil || cut && errors.Is(askCtx.Err(), context.DeadlineExceeded)
	cancel()
	if err != nil {
		if !byCaller {
			wait := multiRetryFirst
			if failed.err != nil {
				wait = min(2*failed.wait, multiRetryMax)
			}
			m.mu.Lock()
			m.failed[i] = multiFailure{err: err, wait: wait, until: now().Add(wait)}
			m.mu.Unlock()
		}
		return s, err
	}
	m.mu.Lock()
	m.supported[i], m.at[i], m.failed[i] = s, now(), multiFailure{}
	m.mu.Unlock()
	return s, nil
}

// remembered is member i's /supported as known without asking a remote:
// a remote member's as the multi last read it (an error when it never
// did), an embedded member's own (kinds: it asks no one).
func (m *MultiFacilitator) remembered(ctx context.Context, i int) (x402.SupportedResponse, error) {
	if _, remote := m.fs[i].(rememberingSigners); !remote {
		return m.kinds(ctx, i)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.at[i].IsZero() {
		return x402.SupportedResponse{}, errors.New("the member's /supported was never read")
	}
	return m.supported[i], nil
}

// ask returns the context of one member's /supported ask: ctx bounded by
// multiAskTimeout and by half ctx's time left, and whether the caller's
// deadline cut it short: to less than half of multiAskTimeout. A member
// that does not answer within half of it has had time a healthy one
// answers in, and its failure is its own. Counting any cut at all as the
// caller's, a caller whose bound is twice multiAskTimeout (the gate's
// settlement-status question, resolveTimeout) always cuts it a little by
// the time it asks, and a member that hangs would never be backed off.
func ask(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	bound := multiAskTimeout
	if dl, ok := ctx.Deadline(); ok {
		bound = min(bound, time.Until(dl)/2)
	}
	cut := bound < multiAskTimeout/2
	c, cancel := context.WithTimeout(ctx, bound)
	return c, cancel, cut
}

// pick returns the facilitator for req; nil with no error when none
// supports it. A Solana offer naming a fee payer (extra.feePayer) goes to
// the member that manages that fee payer, the one the buyer's transaction
// is built around: the offer's fee payer may have been learned from a
// later member while the first was down, and sent to the first once it is
// back, every payment would be refused as fee_payer_not_managed until a
// reload. When no member that answers manages it, the first that settles
// the network is picked (it refuses the payment with its reason), unless
// one did not answer (it may be the manager): then the error.
func (m *MultiFacilitator) pick(ctx context.Context, req x402.PaymentRequirements) (x402.Facilitator, error) {
	i, err := m.pickIndex(ctx, req)
	if i < 0 {
		return nil, err
	}
	return m.fs[i], nil
}

// pickIndex is pick's member by its index in fs, -1 for none.
func (m *MultiFacilitator) pickIndex(ctx context.Context, req x402.PaymentRequirements) (int, error) {
	var errs []error
	first := -1
	for i := range m.fs {
		s, err := m.kinds(ctx, i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, k := range s.Kinds {
			if !settlesKind(k, req) {
				continue
			}
			if managesFeePayer(k, req) {
				return i, nil
			}
			if first < 0 {
				first = i
			}
		}
	}
	if first >= 0 && len(errs) == 0 {
		return first, nil
	}
	return -1, errors.Join(errs...)
}

// settlesKind reports whether a facilitator's /supported kind k is the one
// that settles offer req: its scheme and network, and x402 version 2, the
// only one the gate speaks. A facilitator may list a network under version 1
// too, with another fee payer in its extra.
func settlesKind(k x402.SupportedKind, req x402.PaymentRequirements) bool {
	return k.X402Version == x402.Version && k.Scheme == req.Scheme && k.Network == req.Network
}

// managesFeePayer reports whether kind k's facilitator manages the fee
// payer a Solana offer req names (extra.feePayer), the account that signs
// its settlement: only that facilitator settles the payment or can tell
// its outcome (another answers that the fee payer is not its own). Any
// kind does for an offer that names none or is not Solana's.
func managesFeePayer(k x402.SupportedKind, req x402.PaymentRequirements) bool {
	want, _ := req.Extra["feePayer"].(string)
	if want == "" || !x402.IsSolana(req.Network) {
		return true
	}
	fp, _ := k.Extra["feePayer"].(string)
	return fp == want
}

// Verify implements x402.Facilitator.
func (m *MultiFacilitator) Verify(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.VerifyResponse, error) {
	f, err := m.pick(ctx, req)
	if f == nil {
		if err != nil {
			return x402.VerifyResponse{}, err
		}
		return x402.VerifyResponse{IsValid: false, InvalidReason: x402.ReasonNoFacilitatorForNetwork, InvalidMessage: "no facilitator settles " + req.Network}, nil
	}
	// Never ask the member picked on a context already spent: its
	// failure would read as the member's.
	if err := ctx.Err(); err != nil {
		return x402.VerifyResponse{}, fmt.Errorf("no time left to verify: %w", err)
	}
	return f.Verify(ctx, p, req)
}

// Settle implements x402.Facilitator. Nothing is sent when no facilitator
// supports the payment.
func (m *MultiFacilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	f, err := m.pick(ctx, req)
	if f == nil {
		if err != nil {
			return x402.SettleResponse{}, err
		}
		return x402.SettleResponse{ErrorReason: x402.ReasonNoFacilitatorForNetwork, Network: req.Network}, nil
	}
	// Never ask the member picked on a context already spent: its
	// failure would read as the member's.
	if err := ctx.Err(); err != nil {
		return x402.SettleResponse{}, fmt.Errorf("no time left to settle: %w", err)
	}
	return f.Settle(ctx, p, req)
}

// callTimeouts implements timedFacilitator: its members' longest, and
// the /supported ask of each member before it (multiAskTimeout), since the
// payment goes to whichever member settles it.
func (m *MultiFacilitator) callTimeouts() (verify, settle time.Duration) {
	for _, f := range m.fs {
		v, s := facilitatorTimeouts(f)
		verify, settle = max(verify, v), max(settle, s)
	}
	asks := time.Duration(len(m.fs)) * multiAskTimeout
	return verify + asks, settle + asks
}

// Supported implements x402.Facilitator: the union of every facilitator's
// answer. One that does not answer is an error, so that nothing is
// advertised without the fee payer its kinds need.
func (m *MultiFacilitator) Supported(ctx context.Context) (x402.SupportedResponse, error) {
	out := x402.SupportedResponse{Kinds: []x402.SupportedKind{}, Extensions: []string{}, Signers: map[string][]string{}}
	for i := range m.fs {
		s, err := m.kinds(ctx, i)
		if err != nil {
			return x402.SupportedResponse{}, err
		}
		out.Kinds = append(out.Kinds, s.Kinds...)
		for _, e := range s.Extensions {
			if !slices.Contains(out.Extensions, e) {
				out.Extensions = append(out.Extensions, e)
			}
		}
		for fam, addrs := range s.Signers {
			for _, a := range addrs {
				if !slices.Contains(out.Signers[fam], a) {
					out.Signers[fam] = append(out.Signers[fam], a)
				}
			}
		}
	}
	return out, nil
}

// UnmarshalCaddyfile sets up the module from Caddyfile tokens, one
// facilitator per line:
//
//	multi {
//		evm { … }
//		svm { … }
//		http <url>
//	}
func (m *MultiFacilitator) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name == "multi" {
			return d.Err("multi facilitators do not nest")
		}
		unm, err := caddyfile.UnmarshalModule(d, "x402.facilitators."+name)
		if err != nil {
			return err
		}
		m.FacilitatorsRaw = append(m.FacilitatorsRaw, caddyconfig.JSONModuleObject(unm, "type", name, nil))
	}
	if len(m.FacilitatorsRaw) == 0 {
		return d.Err("multi needs at least one facilitator")
	}
	return nil
}

// fillFeePayers sets extra.feePayer on the gate's Solana offers from the
// /supported kind that settles them (settlesKind: version 2) of the
// facilitator that settles them: a Solana client builds the transaction
// around the facilitator's fee payer and cannot pay without it. A Solana
// offer that every facilitator asked answered for without listing its
// network refuses the configuration. One whose facilitator could not be
// asked (a remote that is down when the config loads) refuses nothing: it
// is returned in waiting, left out of what buyers are shown until
// learnFeePayers learns its fee payer, so one unreachable remote does not
// take down every route of the config.
func (g *Gate) fillFeePayers() (waiting []int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), feePayerAskTimeout)
	defer cancel()
	offers, waiting, cause, err := feePayers(ctx, g.facilitator, g.offers, nil)
	if err != nil {
		return nil, err
	}
	g.offers = offers
	for _, i := range waiting {
		g.logger.Warn("the facilitator that settles a Solana offer could not be asked for its fee payer; the offer is left out of PAYMENT-REQUIRED until it answers",
			zap.Int("accept", i), zap.String("network", g.offers[i].Network), zap.Error(cause))
	}
	return waiting, nil
}

// feePayerAskTimeout bounds one round of fee payer asks (fillFeePayers, and
// each of learnFeePayers's tries).
const feePayerAskTimeout = 10 * time.Second

// errFeePayersUnknown answers a demand for payment when every offer waits
// for its fee payer (learnFeePayers): a demand would list nothing to pay.
// Retry-After 5 s, within the first few of learnFeePayers's tries.
func errFeePayersUnknown() *apierr.Error {
	return apierr.Unavailable("payment facilitator", 5,
		errors.New("the facilitator that settles this route's offers has not been reached for its fee payer yet"))
}

// feePayers returns offers with extra.feePayer set on the Solana ones
// among only (all of them when only is nil), as f settles them, and those
// f could not be asked for (waiting), with why (cause). For a multi, each
// member is asked on its own, in the order it picks a member (pick): the
// fee payer is the first that settles the offer's network, and a member
// that fails is skipped when a later one supplies it. err refuses an offer
// that every member asked answered for without a fee payer. offers is not
// changed.
func feePayers(ctx context.Context, f x402.Facilitator, offers []x402.PaymentRequirements, only []int) (out []x402.PaymentRequirements, waiting []int, cause, err error) {
	out = slices.Clone(offers)
	if f == nil {
		return out, nil, nil, nil // Validate refuses the gate
	}
	var members []func(context.Context) (x402.SupportedResponse, error)
	if m, ok := f.(*MultiFacilitator); ok {
		for i := range m.fs {
			members = append(members, func(ctx context.Context) (x402.SupportedResponse, error) { return m.kinds(ctx, i) })
		}
	} else {
		members = append(members, f.Supported)
	}
	answers := make([]*x402.SupportedResponse, len(members))
	errs := make([]error, len(members))
	ask := func(j int) (*x402.SupportedResponse, error) {
		if answers[j] == nil && errs[j] == nil {
			s, err := members[j](ctx)
			if err != nil {
				errs[j] = err
			} else {
				answers[j] = &s
			}
		}
		return answers[j], errs[j]
	}
	for i, o := range offers {
		if !x402.IsSolana(o.Network) || only != nil && !slices.Contains(only, i) {
			continue
		}
		fp, listed, failed := "", false, false
		for j := range members {
			s, err := ask(j)
			if err != nil {
				failed = true
				continue
			}
			for _, k := range s.Kinds {
				if settlesKind(k, o) {
					fp, _ = k.Extra["feePayer"].(string)
					listed = true
					break
				}
			}
			if listed {
				break
			}
		}
		switch {
		case listed && x402.CheckSolanaAddress(fp) == nil:
			extra := map[string]any{"feePayer": fp}
			for k, v := range o.Extra {
				extra[k] = v
			}
			out[i].Extra = extra
		case !listed && failed:
			waiting = append(waiting, i)
		default:
			return nil, nil, nil, fmt.Errorf("accept %d: the facilitator lists no fee payer for %s %s", i, o.Scheme, o.Network)
		}
	}
	return out, waiting, errors.Join(errs...), nil
}

// learnFeePayers asks, in the background, for the fee payers of the
// Solana offers at the indexes in waiting, each offer on its own and each
// ask bounded by feePayerAskTimeout, the next round put off twice as long,
// from multiRetryFirst up to multiRetryMax, as a multi backs off a failing
// member. Each offer whose fee payer it learns joins the offers buyers
// are shown and may pay (Gate.live) at once. It ends when every one is
// learned, or the config is unloaded (Cleanup). An offer is asked on its
// own so that one whose network the facilitator does not list does not
// keep another's learned fee payer out; that offer stays out, asked again
// each round, and is told as an Error once, and once more (Info) when the
// facilitator answers for it again, not every round.
func (g *Gate) learnFeePayers(waiting []int) {
	ctx, cancel := context.WithCancel(context.Background())
	g.stopLearn = cancel
	offers := slices.Clone(g.offers)
	go func() {
		wait := multiRetryFirst
		refused := map[int]bool{} // offers whose last ask was refused, told once
		for len(waiting) > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, multiRetryMax)
			if !g.uses.Enter() {
				return
			}
			var learnedAny bool
			var still []int
			for _, i := range waiting {
				askCtx, cancelAsk := context.WithTimeout(ctx, feePayerAskTimeout)
				learned, left, _, err := feePayers(askCtx, g.facilitator, offers, []int{i})
				cancelAsk()
				switch {
				case err != nil:
					if !refused[i] {
						refused[i] = true
						g.logger.Error("the facilitator that settles a Solana offer answered without its fee payer; the offer stays left out, asked again until it is listed", zap.Int("accept", i), zap.Error(err))
					}
					still = append(still, i)
					continue
				case refused[i]:
					delete(refused, i)
					g.logger.Info("the facilitator that settles a Solana offer answers for it again", zap.Int("accept", i))
				}
				if len(left) > 0 {
					still = append(still, i)
					continue
				}
				offers[i], learnedAny = learned[i], true
			}
			g.uses.Leave()
			if !learnedAny {
				continue
			}
			waiting = still
			encoded := make([]json.RawMessage, len(offers))
			for i, o := range offers {
				encoded[i], _ = json.Marshal(o) // as encodeOffers, which took them all
			}
			g.live.Store(newOfferSet(offers, encoded, g.decimals, waiting))
			g.logger.Info("learned the fee payer of a Solana offer; it is offered", zap.Int("waiting", len(waiting)))
		}
	}()
}

// svmClaimHold is how long a Solana payment's claim lasts at the least. Its
// transaction can land until its blockhash expires, 150 blocks after the
// blockhash (60–90 s at usual slot times, longer when slots slow down), and
// an unknown outcome is judged "never" only by a look after that expiry (on
// the buyer's retry, or the background pass every resolveInterval). A claim
// that lapsed first would take its held answer with it: the outcome would
// stay unknown, the history pending, and a transfer that landed would have
// bought nothing. The claim therefore outlives expiry and a few passes.
const svmClaimHold = 10 * time.Minute

// readSVMPayment reads a Solana payment's transaction once, before it is
// claimed or forwarded, with the one reading this gateway has
// (svmfacilitator.DecodePayload: the canonical padded base64 of a
// transaction it decodes). Facilitators read more spellings than that
// (the official one ignores what follows an "=", missing padding and
// trailing bits) as the same transaction, and a payment the gate could not
// read would be claimed under its exact header alone: one transaction sent
// in several spellings would be claimed, verified and run once per
// spelling. Anything else is an unreadable payment, named without being
// echoed.
func readSVMPayment(p x402.PaymentPayload) (*svmfacilitator.Transaction, error) {
	tx, err := svmfacilitator.DecodePayload(p.Payload)
	if err != nil {
		return nil, &x402.PaymentError{Kind: x402.ErrInvalidPayment, Reason: x402.ReasonInvalidPayload, Field: "payload.transaction",
			Problem: "must be a Solana transaction in standard base64 with padding"}
	}
	return tx, nil
}

// svmClaimKey names a Solana payment by its message (the SHA-256 of the
// signed bytes) on network: the client controls the bytes of the fee
// payer's empty signature slot, so the same payment can arrive in many
// encodings, but never with another message.
func svmClaimKey(network string, tx *svmfacilitator.Transaction) string {
	h := tx.MessageHash()
	return "x402/svm/" + network + "/" + hex.EncodeToString(h[:])
}

// Interface guards
var (
	_ caddy.Provisioner     = (*SVMFacilitator)(nil)
	_ caddy.CleanerUpper    = (*SVMFacilitator)(nil)
	_ caddyfile.Unmarshaler = (*SVMFacilitator)(nil)
	_ x402.Facilitator      = (*SVMFacilitator)(nil)
	_ caddy.Provisioner     = (*MultiFacilitator)(nil)
	_ caddyfile.Unmarshaler = (*MultiFacilitator)(nil)
	_ x402.Facilitator      = (*MultiFacilitator)(nil)
)
