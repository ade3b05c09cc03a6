package caddymodule

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// TestSVMFacilitatorFailureBudgetOptions: the failure budget knobs parse
// from the svm block, bad values are refused, and the provisioned
// facilitator applies them: with max_failed_lamports 1 no fee fits, so a
// payment asking for a priority fee over max_priority_fee_past_budget is
// refused before the chain is asked, while one within it (with a second
// Memo, which the budget does not look at) goes on to the chain's
// simulation (the rpc_url answers nothing, so that is an error).
func TestSVMFacilitatorFailureBudgetOptions(t *testing.T) {
	seed := sha256.Sum256([]byte("svm budget options fee payer"))
	key := ed25519.NewKeyFromSeed(seed[:])
	keyFile := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(keyFile, []byte(base58.Encode(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	m := new(SVMFacilitator)
	err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`svm {
		network solana-devnet
		rpc_url http://127.0.0.1:1
		fee_payer_key_file ` + keyFile + `
		max_failed_per_payer 5
		max_in_flight_per_payer 7
		max_failed_lamports 1
		max_priority_fee_past_budget 2
		failure_window 30m
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.MaxFailedPerPayer != 5 || m.MaxInFlightPerPayer != 7 || m.MaxFailedLamports != 1 || m.MaxPriorityFeePastBudget != 2 || time.Duration(m.FailureWindow) != 30*time.Minute {
		t.Fatalf("parsed %+v", m)
	}
	for _, bad := range []string{"max_failed_per_payer 0", "max_failed_per_payer x", "max_in_flight_per_payer -1", "max_failed_lamports 0", "max_priority_fee_past_budget 0", "max_priority_fee_past_budget -1", "max_priority_fee_past_budget", "failure_window 0s", "failure_window soon"} {
		if err := new(SVMFacilitator).UnmarshalCaddyfile(caddyfile.NewTestDispenser("svm {\n" + bad + "\n}")); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
	// The counts (int) and the lamports (uint64) are read by one rule: a
	// plain decimal of at least 1 that fits the field, no sign.
	for _, bad := range []string{
		"max_failed_per_payer 9223372036854775808", "max_in_flight_per_payer +3", "max_failed_per_payer 1.0",
		"max_failed_lamports 18446744073709551616", "max_priority_fee_past_budget +3", "max_failed_lamports 0x10",
	} {
		err := new(SVMFacilitator).UnmarshalCaddyfile(caddyfile.NewTestDispenser("svm {\n" + bad + "\n}"))
		// The error names the option, not only the value.
		if name, _, _ := strings.Cut(bad, " "); err == nil || !strings.Contains(err.Error(), name+": must be a whole number of at least 1") {
			t.Errorf("%q: error %v", bad, err)
		}
	}
	big := new(SVMFacilitator)
	if err := big.UnmarshalCaddyfile(caddyfile.NewTestDispenser("svm {\nmax_in_flight_per_payer 9223372036854775807\nmax_failed_lamports 18446744073709551615\n}")); err != nil ||
		big.MaxInFlightPerPayer != math.MaxInt || big.MaxFailedLamports != math.MaxUint64 {
		t.Errorf("the largest values: %v, %+v", err, big)
	}

	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Cleanup()
	payer := ed25519.NewKeyFromSeed(make([]byte, 32))
	var fp, payTo svmfacilitator.PublicKey
	copy(fp[:], key.Public().(ed25519.PublicKey))
	payTo[0] = 9
	mint, _ := svmfacilitator.ParsePublicKey(solanachain.USDC)
	p := svmfacilitator.Payment{FeePayer: fp, Authority: payer, Mint: mint, Program: svmfacilitator.TokenProgram, PayTo: payTo, Amount: 20000, Decimals: 6}
	req := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet, Amount: "20000", Asset: solanachain.USDC,
		PayTo: payTo.String(), MaxTimeoutSeconds: 60, Extra: map[string]any{"feePayer": fp.String()}}
	ixs := p.Instructions()
	ixs[1] = svmfacilitator.ComputePriceIx(150) // × 20,000 units: 3 lamports
	v, err := m.Verify(t.Context(), svmfacilitator.Payload(p.Build(ixs), req), req)
	if err != nil || v.InvalidReason != svmfacilitator.ReasonFailureBudgetPriorityFee || !strings.Contains(v.InvalidMessage, "at most 2 lamports, this one asks for 3") {
		t.Fatalf("verify over the priority fee cap: %+v %v", v, err)
	}
	v, err = m.Verify(t.Context(), svmfacilitator.Payload(p.Build(append(p.Instructions(), svmfacilitator.MemoIx("second"))), req), req)
	if err == nil || !strings.Contains(err.Error(), "simulating") {
		t.Fatalf("verify within the priority fee cap: %+v %v; want the chain asked", v, err)
	}
}

// TestSVMComputeCapsOfZeroAreRefused: max_compute_units and
// max_compute_unit_price of 0 are refused at config load, in the Caddyfile
// and in the JSON config alike, never read as the defaults (50,000 units ×
// 5,000,000 micro-lamports, the largest priority fee: what an operator
// writing 0 means least). The smallest caps, 1, are accepted and applied:
// a payment asking for more is refused before the chain is asked, one
// within them goes on to the chain's simulation (the rpc_url answers
// nothing, so that is an error).
func TestSVMComputeCapsOfZeroAreRefused(t *testing.T) {
	seed := sha256.Sum256([]byte("svm zero caps fee payer"))
	key := ed25519.NewKeyFromSeed(seed[:])
	keyFile := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(keyFile, []byte(base58.Encode(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, opt := range []string{"max_compute_units", "max_compute_unit_price"} {
		for _, bad := range []string{"0", "-1", "+1", "x", "18446744073709551616"} {
			err := new(SVMFacilitator).UnmarshalCaddyfile(caddyfile.NewTestDispenser("svm {\n" + opt + " " + bad + "\n}"))
			wantErr(t, err, opt+": must be a whole number of at least 1")
		}
	}
	wantErr(t, new(SVMFacilitator).UnmarshalCaddyfile(caddyfile.NewTestDispenser("svm {\nmax_compute_units 4294967296\n}")),
		"max_compute_units: must be a whole number of at least 1")

	// Through the adapter: the whole Caddyfile is refused.
	site := func(caps string) string {
		return `:1 {
	x402_facilitator {
		pay_to ` + cfgPayTo + `
		svm {
			network solana-devnet
			rpc_url http://127.0.0.1:1
			fee_payer_key_file ` + keyFile + `
			` + caps + `
		}
	}
}
`
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	if _, _, err := adapter.Adapt([]byte(site("max_compute_unit_price 0")), map[string]any{"filename": "Caddyfile"}); err == nil || !strings.Contains(err.Error(), "max_compute_unit_price: must be a whole number of at least 1") {
		t.Fatalf("adapting max_compute_unit_price 0: %v", err)
	}
	js, _, err := adapter.Adapt([]byte(site("max_compute_units 1\n\t\t\tmax_compute_unit_price 1")), map[string]any{"filename": "Caddyfile"})
	if err != nil || !bytes.Contains(js, []byte(`"max_compute_units":1,`)) || !bytes.Contains(js, []byte(`"max_compute_unit_price":1,`)) {
		t.Fatalf("adapting caps of 1: %v\n%s", err, js)
	}

	// The JSON config, as Caddy loads a module (strict decoding, then
	// Provision).
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	module := func(caps string) json.RawMessage {
		kf, _ := json.Marshal(keyFile)
		return json.RawMessage(`{"network":"solana-devnet","rpc_url":"http://127.0.0.1:1","fee_payer_key_file":` + string(kf) + caps + `}`)
	}
	for _, bad := range []string{`,"max_compute_units":0`, `,"max_compute_unit_price":0`, `,"max_failed_per_payer":0`, `,"max_in_flight_per_payer":-1`, `,"max_failed_lamports":0`, `,"max_priority_fee_past_budget":0`} {
		if _, err := ctx.LoadModuleByID("x402.facilitators.svm", module(bad)); err == nil || !strings.Contains(err.Error(), "must be a whole number of at least 1 (leave it out for the default)") {
			t.Errorf("loading %s: %v", bad, err)
		}
	}
	if _, err := ctx.LoadModuleByID("x402.facilitators.svm", module(`,"max_compute_unit_prize":1`)); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("an unknown field: %v", err)
	}
	mod, err := ctx.LoadModuleByID("x402.facilitators.svm", module(`,"max_compute_units":20000,"max_compute_unit_price":1`))
	if err != nil {
		t.Fatal(err)
	}
	m := mod.(*SVMFacilitator)
	defer m.Cleanup()

	payer := ed25519.NewKeyFromSeed(make([]byte, 32))
	var fp, payTo svmfacilitator.PublicKey
	copy(fp[:], key.Public().(ed25519.PublicKey))
	payTo[0] = 9
	mint, _ := svmfacilitator.ParsePublicKey(solanachain.USDC)
	p := svmfacilitator.Payment{FeePayer: fp, Authority: payer, Mint: mint, Program: svmfacilitator.TokenProgram, PayTo: payTo, Amount: 20000, Decimals: 6}
	req := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet, Amount: "20000", Asset: solanachain.USDC,
		PayTo: payTo.String(), MaxTimeoutSeconds: 60, Extra: map[string]any{"feePayer": fp.String()}}
	ixs := p.Instructions()
	ixs[1] = svmfacilitator.ComputePriceIx(2)
	if v, err := m.Verify(t.Context(), svmfacilitator.Payload(p.Build(ixs), req), req); err != nil || v.InvalidReason != svmfacilitator.ReasonComputePriceTooHigh {
		t.Fatalf("a price of 2 over a cap of 1: %+v %v", v, err)
	}
	ixs[0], ixs[1] = svmfacilitator.ComputeLimitIx(20_001), svmfacilitator.ComputePriceIx(1)
	if v, err := m.Verify(t.Context(), svmfacilitator.Payload(p.Build(ixs), req), req); err != nil || v.InvalidReason != svmfacilitator.ReasonComputeLimitTooHigh {
		t.Fatalf("a limit of 20,001 over a cap of 20,000: %+v %v", v, err)
	}
	if v, err := m.Verify(t.Context(), svmfacilitator.Payload(p.Build(p.Instructions()), req), req); err == nil || !strings.Contains(err.Error(), "simulating") {
		t.Fatalf("the official client's 20,000 units at 1 micro-lamport: %+v %v; want the chain asked", v, err)
	}
}

// TestFacilitatorJSONNamesAreReadAsEncodingJSONReadsThem: Caddy decodes a
// module's JSON config with encoding/json, which matches a member to a
// field whatever its letter case, lets the last of several such members
// stand, and leaves a field alone for null. The refusal of a written 0
// reads the config the same way: a 0 in another case is refused (not read
// as the default: 5,000,000 micro-lamports, 3 failures), the error names
// the field by its documented name and not as written, a later member
// overrides an earlier one, and null asks for the default as leaving the
// member out does. A failure_window of 0 or less is refused in JSON as
// the Caddyfile refuses it, for both facilitator modules.
func TestFacilitatorJSONNamesAreReadAsEncodingJSONReadsThem(t *testing.T) {
	seed := sha256.Sum256([]byte("svm json names fee payer"))
	keyFile := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(keyFile, []byte(base58.Encode(ed25519.NewKeyFromSeed(seed[:]))), 0o600); err != nil {
		t.Fatal(err)
	}
	kf, _ := json.Marshal(keyFile)
	svm := func(members string) json.RawMessage {
		return json.RawMessage(`{"network":"solana-devnet","rpc_url":"http://127.0.0.1:1","fee_payer_key_file":` + string(kf) + members + `}`)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	load := func(members string) (*SVMFacilitator, error) {
		mod, err := ctx.LoadModuleByID("x402.facilitators.svm", svm(members))
		if err != nil {
			return nil, err
		}
		m := mod.(*SVMFacilitator)
		t.Cleanup(func() { m.Cleanup() })
		return m, nil
	}

	refused := []struct{ members, want string }{
		{`,"Max_Compute_Unit_Price":0`, "max_compute_unit_price must be a whole number of at least 1"},
		{`,"MAX_FAILED_PER_PAYER":0`, "max_failed_per_payer must be a whole number of at least 1"},
		{`,"Max_Failed_Lamports":0`, "max_failed_lamports must be a whole number of at least 1"},
		{`,"max_failed_per_payer":5,"Max_Failed_Per_Payer":0`, "max_failed_per_payer must be a whole number of at least 1"},
		{`,"max_failed_per_payer":0,"Max_Failed_Per_Payer":null`, "max_failed_per_payer must be a whole number of at least 1"},
		{`,"failure_window":"0s"`, "failure_window must be a positive duration"},
		{`,"Failure_Window":"-1h"`, "failure_window must be a positive duration"},
		{`,"failure_window":0`, "failure_window must be a positive duration"},
	}
	for _, tc := range refused {
		_, err := load(tc.members)
		if err == nil || !strings.Contains(err.Error(), "svm facilitator: "+tc.want) {
			t.Errorf("svm %s: %v; want %q", tc.members, err, tc.want)
			continue
		}
		if name, _, _ := strings.Cut(tc.members[2:], `"`); name != strings.ToLower(name) && strings.Contains(err.Error(), name) {
			t.Errorf("svm %s: the error echoes the member as written: %v", tc.members, err)
		}
	}

	m, err := load(`,"max_failed_per_payer":0,"Max_Failed_Per_Payer":5,"failure_window":"30m"`)
	if err != nil || m.MaxFailedPerPayer != 5 || time.Duration(m.FailureWindow) != 30*time.Minute {
		t.Fatalf("a 0 overridden by a later member: %v %+v; want loaded with 5 and 30m", err, m)
	}
	m, err = load(`,"max_failed_per_payer":null,"max_compute_unit_price":null,"failure_window":null`)
	if err != nil || m.MaxFailedPerPayer != 0 || m.MaxComputeUnitPrice != 0 || m.FailureWindow != 0 {
		t.Fatalf("null members: %v %+v; want loaded with the defaults, as when left out", err, m)
	}

	for _, tc := range []struct{ members, want string }{
		{`,"Max_Failed_Per_Payer":0`, "max_failed_per_payer must be a whole number of at least 1"},
		{`,"failure_window":"0s"`, "failure_window must be a positive duration"},
		{`,"failure_window":"-1h"`, "failure_window must be a positive duration"},
	} {
		var evm EVMFacilitator
		err := caddy.StrictUnmarshalJSON([]byte(`{"network":"base","rpc_url":"http://127.0.0.1:1"`+tc.members+`}`), &evm)
		if err == nil || !strings.Contains(err.Error(), "evm facilitator: "+tc.want) {
			t.Errorf("evm %s: %v; want %q", tc.members, err, tc.want)
		}
	}
	var evm EVMFacilitator
	if err := caddy.StrictUnmarshalJSON([]byte(`{"network":"base","max_failed_per_payer":null,"failure_window":"2h"}`), &evm); err != nil || evm.MaxFailedPerPayer != 0 || time.Duration(evm.FailureWindow) != 2*time.Hour {
		t.Fatalf("evm with null and a positive window: %v %+v", err, evm)
	}
}
