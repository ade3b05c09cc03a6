package walletauth

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/core/vm"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// TestContractWalletSignsThroughEIP1271 deploys a contract wallet on the
// devnet, reached over JSON-RPC as a gateway reaches a real chain, and
// checks that its owner's signatures are accepted for it only when a chain
// is configured and the proof names that chain.
func TestContractWalletSignsThroughEIP1271(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a devnet")
	}
	d, err := evmfacilitator.StartDevnet(evmfacilitator.DevnetConfig{RPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("starting devnet: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	rpc, err := ethclient.Dial(d.RPCURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rpc.Close)
	owner := evmfacilitator.DevKey(3)
	deploying, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wallet, err := d.DeployTestWallet(deploying, crypto.PubkeyToAddress(owner.PublicKey))
	if err != nil {
		t.Fatal(err)
	}

	// proof signs for the wallet with key on chain.
	proof := func(key *ecdsa.PrivateKey, chain string) string {
		e := envelope(t)
		e.ChainID = chain
		e.Nonce = strings.ToUpper(NewNonce())
		if err := e.Sign(key); err != nil {
			t.Fatal(err)
		}
		e.Address = wallet.Hex()
		h, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	// The owner signs the text naming the wallet.
	walletProof := func(key *ecdsa.PrivateKey, chain string) string {
		e := envelope(t)
		e.ChainID = chain
		e.Nonce = NewNonce()
		if err := e.SignAs(key, wallet); err != nil {
			t.Fatal(err)
		}
		h, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	ctx := context.Background()
	now := clock(t0.Add(time.Minute))
	cases := []struct {
		desc     string
		chain    Chain
		header   string
		wantErr  error
		contract bool
	}{
		{"the owner's signature is accepted for the wallet", rpc, walletProof(owner, "eip155:1337"), nil, true},
		{"another key's signature is refused by the wallet", rpc, walletProof(evmfacilitator.DevKey(4), "eip155:1337"), ErrBadSignature, false},
		{"a proof naming another chain is refused", rpc, walletProof(owner, "eip155:8453"), ErrBadSignature, false},
		{"without a chain a contract wallet cannot sign", nil, walletProof(owner, "eip155:1337"), ErrBadSignature, false},
		{"a signature over another address's text is refused", rpc, proof(owner, "eip155:1337"), ErrBadSignature, false},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			v := &Verifier{Nonces: newDB(t).Claims(), Now: now}
			if tc.chain != nil {
				v.Chain = tc.chain
			}
			p, err := v.Verify(ctx, tc.header, want)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if err == nil && (p.Address != wallet || p.Contract != tc.contract) {
				t.Errorf("proof %+v", p)
			}
		})
	}

	// The devnet's token has code but no isValidSignature, so the call
	// reverts: go-ethereum's answer to it, in process (the simulated
	// backend) and over JSON-RPC, is the wallet refusing the signature,
	// not an error.
	t.Run("a revert is a refusal, in process and over JSON-RPC", func(t *testing.T) {
		for name, c := range map[string]Chain{"simulated": d.Client(), "json-rpc": rpc} {
			ok, err := isValidSignature(ctx, c, d.Token(), [32]byte{1}, make([]byte, 65))
			if ok || err != nil {
				t.Errorf("%s: %v, %v; want a refusal (false, nil)", name, ok, err)
			}
		}
	})

	t.Run("an unreachable chain is an outage, not a refusal", func(t *testing.T) {
		dead, err := ethclient.Dial("http://127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		v := &Verifier{Nonces: newDB(t).Claims(), Now: now, Chain: dead}
		_, err = v.Verify(ctx, walletProof(owner, "eip155:1337"), want)
		var we *Error
		if err == nil || errors.As(err, &we) {
			t.Fatalf("error %v, want a non-refusal error", err)
		}
	})
}

// TestPrecompileIsNotAContractWallet: the identity precompile (0x…04)
// answers any call with its calldata, whose first four bytes are
// isValidSignature's selector, which is also EIP-1271's magic value. Nobody
// holds a key for it, so no proof, in either format, may establish it as
// the caller's wallet: it has no code, and its answer is not the 32-byte
// word a contract returning bytes4 gives.
func TestPrecompileIsNotAContractWallet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a devnet")
	}
	d, err := evmfacilitator.StartDevnet(evmfacilitator.DevnetConfig{RPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("starting devnet: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	rpc, err := ethclient.Dial(d.RPCURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rpc.Close)
	const identity = "0x0000000000000000000000000000000000000004"
	zeros := "0x" + strings.Repeat("00", 65) // recovers to no one

	t.Run("X-Wallet-Auth", func(t *testing.T) {
		e := envelope(t)
		e.ChainID = "eip155:1337"
		e.Nonce = NewNonce()
		e.Address = identity
		e.Signature = zeros
		h, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Minute)), Chain: rpc}
		p, err := v.Verify(context.Background(), h, want)
		if !errors.Is(err, ErrBadSignature) {
			t.Fatalf("error %v (proof %+v), want ErrBadSignature", err, p)
		}
	})
	t.Run("SIGN-IN-WITH-X", func(t *testing.T) {
		s := siwxProof(t, t0, func(s *SIWX) { s.ChainID = "eip155:1337" })
		s.Address = identity
		s.Signature = zeros
		v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Minute)), Chain: rpc}
		p, err := v.VerifySIWX(context.Background(), siwxHeader(t, s), siwxWant)
		if !errors.Is(err, ErrBadSignature) {
			t.Fatalf("error %v (proof %+v), want ErrBadSignature", err, p)
		}
	})
}

// evmHalts must be the messages go-ethereum's EVM gives its execution
// errors, or a halt would be taken for an outage (or an outage for a
// refusal).
func TestEVMHaltsAreGethsErrors(t *testing.T) {
	geth := []error{vm.ErrExecutionReverted, vm.ErrOutOfGas, &vm.ErrInvalidOpCode{}, vm.ErrInvalidJump,
		vm.ErrStackUnderflow{}, vm.ErrStackOverflow{}, vm.ErrReturnDataOutOfBounds, vm.ErrGasUintOverflow,
		vm.ErrWriteProtection, vm.ErrDepth}
	for _, e := range geth {
		if !slices.ContainsFunc(evmHalts, func(h string) bool { return strings.HasPrefix(e.Error(), h) }) {
			t.Errorf("go-ethereum's %q is not in evmHalts", e)
		}
	}
	if len(evmHalts) != len(geth) {
		t.Errorf("evmHalts has %d messages, go-ethereum's errors are %d", len(evmHalts), len(geth))
	}
}
