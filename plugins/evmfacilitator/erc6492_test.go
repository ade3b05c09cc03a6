package evmfacilitator

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// wrap6492 wraps sig as ERC-6492 does: abi.encode(factory, factoryCalldata,
// sig) followed by the 32-byte magic suffix.
func wrap6492(t *testing.T, factory common.Address, calldata, sig []byte) []byte {
	t.Helper()
	addrT, _ := abi.NewType("address", "", nil)
	bytesT, _ := abi.NewType("bytes", "", nil)
	enc, err := abi.Arguments{{Type: addrT}, {Type: bytesT}, {Type: bytesT}}.Pack(factory, calldata, sig)
	if err != nil {
		t.Fatal(err)
	}
	return append(enc, erc6492Magic...)
}

// ERC-6492 says a verifier of a wrapped signature deploys the wallet if it
// is not deployed and then asks isValidSignature with the UNWRAPPED
// signature; the x402 reference (verify_universal.go, erc6492.go) unwraps
// before its EIP-1271 call and settles with the inner signature. README:
// "Longer signatures (smart wallets, ERC-1271 / ERC-6492) are checked on
// chain". A deployed wallet's owner signature wrapped in ERC-6492 (as smart
// wallet SDKs send it) is refused here as not the payer's.
func TestDeployedWalletERC6492SignatureIsUnwrapped(t *testing.T) {
	e := newEnv(t)
	owner := DevKey(4)
	wallet := deployWallet(t, e.d, crypto.PubkeyToAddress(owner.PublicKey))
	fundUSDC(t, e.d, DevKey(5), wallet, 1_000_000)
	req := e.requirements(payee, amount)
	a := auth(owner, req)
	a.From = wallet.Hex()
	plain := sign(t, owner, a, req, req)
	var pl x402.ExactEVMPayload
	if err := json.Unmarshal(plain.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	if v, err := e.f.Verify(context.Background(), plain, req); err != nil || !v.IsValid {
		t.Fatalf("control: plain EIP-1271 signature verify = %+v, %v", v, err)
	}
	wrapped := wrap6492(t, common.HexToAddress("0x00000000000000000000000000000000000fac70"), []byte{0xde, 0xad}, common.FromHex(pl.Signature))
	p := payload(t, "0x"+hex.EncodeToString(wrapped), a, req)
	v, err := e.f.Verify(context.Background(), p, req)
	if err != nil || !v.IsValid {
		t.Errorf("verify of the deployed wallet's ERC-6492-wrapped owner signature = %+v, %v; want valid (unwrapped for EIP-1271, as ERC-6492 and the x402 reference do)", v, err)
	}
	s, err := e.f.Settle(context.Background(), p, req)
	if err != nil || !s.Success {
		t.Errorf("settle = %+v, %v; want success", s, err)
	}
}

// An ERC-6492 signature whose envelope does not decode is refused as a bad
// signature for a deployed wallet, and a wallet without code stays refused
// as undeployed (this facilitator deploys no wallets).
func TestERC6492SignatureRefusals(t *testing.T) {
	e := newEnv(t)
	owner := DevKey(4)
	wallet := deployWallet(t, e.d, crypto.PubkeyToAddress(owner.PublicKey))
	fundUSDC(t, e.d, DevKey(5), wallet, 1_000_000)
	req := e.requirements(payee, amount)
	a := auth(owner, req)
	a.From = wallet.Hex()
	garbled := append(make([]byte, 40), erc6492Magic...) // no abi.encode(address, bytes, bytes)
	v, err := e.f.Verify(context.Background(), payload(t, "0x"+hex.EncodeToString(garbled), a, req), req)
	if err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMSignature || !strings.Contains(v.InvalidMessage, "ERC-6492") {
		t.Errorf("verify of a deployed wallet's ERC-6492 signature with a garbled envelope = %+v, %v; want %s", v, err, x402.ReasonExactEVMSignature)
	}

	a = auth(owner, req)
	a.From = "0x00000000000000000000000000000000000a11e7" // no code
	plain := sign(t, owner, a, req, req)
	var pl x402.ExactEVMPayload
	if err := json.Unmarshal(plain.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	wrapped := wrap6492(t, common.HexToAddress("0x00000000000000000000000000000000000fac70"), []byte{0xde, 0xad}, common.FromHex(pl.Signature))
	v, err = e.f.Verify(context.Background(), payload(t, "0x"+hex.EncodeToString(wrapped), a, req), req)
	if err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMUndeployedSmartWallet {
		t.Errorf("verify of an undeployed wallet's ERC-6492 signature = %+v, %v; want %s", v, err, x402.ReasonExactEVMUndeployedSmartWallet)
	}
}
