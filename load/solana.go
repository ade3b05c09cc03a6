package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// skipped is a scenario that cannot run here, and why: the report says so
// and the run goes on.
type skipped struct{ why string }

func (s skipped) Error() string { return s.why }

// solanaChain is the wallet file the local Solana chain writes when it
// starts (make run: $data/solana-chain.json): its RPC URL, its USDC mint
// and its funded development wallets, keys included.
type solanaChain struct {
	URL     string `json:"url"`
	USDC    string `json:"usdc"`
	Wallets []struct {
		Address   string `json:"address"`
		SecretKey string `json:"secretKey"`
	} `json:"wallets"`
}

// blockhashAge is how long one blockhash is reused: well inside its
// validity on any Solana chain (about a minute), and few RPC calls.
const blockhashAge = 10 * time.Second

// prepareSolana builds the paid-solana workload: a real SVM exact payment
// per request for the route's solana-devnet offer, a TransferChecked of
// the offer's amount from one of the chain's funded wallets to its payTo,
// fees paid by its extra.feePayer, signed by the buyer only. Payments
// differ in a random memo (the chain refuses a transaction it has seen;
// the facilitator accepts any memo unless the offer names one), so many
// share one recent blockhash, read again every blockhashAge.
func prepareSolana(ctx context.Context, client *client, cfg config, endpoint string) (workload, error) {
	if cfg.solanaChain == "" {
		return workload{}, skipped{"no Solana chain (-solana-chain: the wallet file the local chain writes, $data/solana-chain.json under make run)"}
	}
	b, err := readBounded(cfg.solanaChain, maxBodyBytes)
	if err != nil {
		return workload{}, skipped{fmt.Sprintf("no Solana chain: %v", err)}
	}
	var chain solanaChain
	if err := json.Unmarshal(b, &chain); err != nil {
		return workload{}, fmt.Errorf("%s: %w", cfg.solanaChain, err)
	}
	rpcURL, err := loopbackURL(chain.URL)
	if err != nil {
		return workload{}, fmt.Errorf("%s: url: %w", cfg.solanaChain, err)
	}
	required, err := paymentRequired(ctx, client, endpoint)
	if err != nil {
		return workload{}, err
	}
	var offer *x402.PaymentRequirements
	for i, a := range required.Accepts {
		if a.Network == x402.NetworkSolanaDevnet && a.Scheme == "exact" {
			offer = &required.Accepts[i]
		}
	}
	if offer == nil {
		return workload{}, skipped{"the route offers no exact payment on solana-devnet"}
	}
	if m, _ := offer.Extra["memo"].(string); m != "" {
		return workload{}, skipped{"the offer names its memo (extra.memo), and payments here differ only in theirs"}
	}
	if offer.Asset != chain.USDC {
		return workload{}, fmt.Errorf("the offer asks for %s, not the chain's USDC %s", offer.Asset, chain.USDC)
	}
	fp, _ := offer.Extra["feePayer"].(string)
	feePayer, err := svmfacilitator.ParsePublicKey(fp)
	if err != nil {
		return workload{}, fmt.Errorf("the offer's extra.feePayer: %w", err)
	}
	payTo, err := svmfacilitator.ParsePublicKey(offer.PayTo)
	if err != nil {
		return workload{}, fmt.Errorf("the offer's payTo: %w", err)
	}
	mint, err := svmfacilitator.ParsePublicKey(offer.Asset)
	if err != nil {
		return workload{}, fmt.Errorf("the offer's asset: %w", err)
	}
	units, err := strconv.ParseUint(offer.Amount, 10, 64)
	if err != nil || units == 0 {
		return workload{}, fmt.Errorf("the offer's amount %q is not a positive integer", offer.Amount)
	}
	// Payers rotate over the chain's wallets, the payee's own left out.
	var payers []svmfacilitator.Payment
	for _, w := range chain.Wallets {
		if w.Address == offer.PayTo {
			continue
		}
		key, err := svmfacilitator.ParseKey(w.SecretKey)
		if err != nil {
			return workload{}, fmt.Errorf("%s: wallet %s: %w", cfg.solanaChain, w.Address, err)
		}
		// The chain's USDC has 6 decimals (interop/solana-chain.mjs).
		payers = append(payers, svmfacilitator.Payment{FeePayer: feePayer, Authority: key, Mint: mint,
			Program: svmfacilitator.TokenProgram, PayTo: payTo, Amount: units, Decimals: 6})
	}
	if len(payers) == 0 {
		return workload{}, fmt.Errorf("%s: no funded wallet other than payTo", cfg.solanaChain)
	}
	rpc := &svmfacilitator.RPC{URL: rpcURL.String(), Timeout: 5 * time.Second}
	bh := &blockhashes{rpc: rpc}
	if _, err := bh.get(ctx); err != nil {
		return workload{}, skipped{fmt.Sprintf("the Solana chain at %s does not answer: %v", rpcURL, err)}
	}
	var n atomic.Int64
	return paidWorkload(endpoint, cfg.body, func(ctx context.Context) (x402.PaymentPayload, error) {
		hash, err := bh.get(ctx)
		if err != nil {
			return x402.PaymentPayload{}, err
		}
		p := payers[int(n.Add(1))%len(payers)]
		p.Blockhash = hash
		var nonce [16]byte
		rand.Read(nonce[:])
		p.Memo = hex.EncodeToString(nonce[:])
		return svmfacilitator.Payload(p.Transaction(), *offer), nil
	}), nil
}

// blockhashes hands out one recent blockhash, read again when it is older
// than blockhashAge.
type blockhashes struct {
	rpc  *svmfacilitator.RPC
	mu   sync.Mutex
	hash [32]byte
	at   time.Time
}

func (b *blockhashes) get(ctx context.Context) ([32]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if time.Since(b.at) < blockhashAge {
		return b.hash, nil
	}
	h, err := b.rpc.LatestBlockhash(ctx)
	if err != nil {
		return h, fmt.Errorf("getLatestBlockhash: %w", err)
	}
	b.hash, b.at = h, time.Now()
	return h, nil
}

// paidSolanaLine compares the Solana paid path with the plain
// reverse_proxy carrying the same request unpaid: no block time bounds
// it, so its rate is the gateway's, and so is Caddy's CPU per call when
// the facilitator runs in its own process (its verify and settle, with
// their chain reads, then shown apart). With the facilitator inside Caddy
// they are part of Caddy's figure, and the line says so.
func paidSolanaLine(results []stats, c int) (string, bool) {
	s, ok := phaseOf(results, "paid-solana", c)
	if !ok {
		return "", false
	}
	line := fmt.Sprintf("paid-solana at %d: %.0f req/s", c, s.rate())
	base, hasBase := phaseOf(results, "baseline", c)
	if hasBase {
		line += fmt.Sprintf(", %.2fx the plain reverse_proxy (target >= 0.9x)", s.rate()/base.rate())
	}
	gc, ok := perRequest(s, "caddy")
	if !ok {
		return line, true
	}
	fc, remote := perRequest(s, "facilitator")
	if remote {
		line += fmt.Sprintf("; gateway caddy CPU/req %.0fµs, the facilitator in its own process %.0fµs for its verify and settle", gc, fc)
	} else {
		line += fmt.Sprintf("; caddy CPU/req %.0fµs, the facilitator's verify and settle inside it (AOV_FACILITATOR=remote measures the gateway alone)", gc)
	}
	if cc, ok := perRequest(s, "solana-chain"); ok {
		line += fmt.Sprintf(", the chain %.0fµs", cc)
	}
	if hasBase {
		if bc, ok := perRequest(base, "baseline"); ok && gc > 0 {
			line += fmt.Sprintf("; the plain reverse_proxy's caddy %.0fµs per call: %.2fx", bc, bc/gc)
		}
	}
	return line, true
}
