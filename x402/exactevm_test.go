package x402

import (
	"crypto/ecdsa"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/math"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"
)

func TestTypehashesAreTheSpecValues(t *testing.T) {
	for _, tc := range []struct {
		desc string
		got  common.Hash
		want string
	}{
		{"the EIP712Domain typehash is 0x8b73…400f", EIP712DomainTypehash, "0x8b73c3c69bb8fe3d512ecc4cf759cc79239f7b179b0ffacaa9a75d522b39400f"},
		{"the TransferWithAuthorization typehash is 0x7c7c…2267", TransferWithAuthorizationTypehash, "0x7c7c6cdb67a18743f49ec6fa9b35f50d52ed05cbed4cc592e13b44501c1a2267"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if tc.got.Hex() != tc.want {
				t.Fatalf("got %s, want %s", tc.got.Hex(), tc.want)
			}
		})
	}
}

func TestDomainSeparatorOfUSDC(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		network string
		want    string
	}{
		{"Base USDC's domain separator is the on-chain value", NetworkBase, "0x02fa7265e7c5d81118673727957699e4d68f74cd74b7db77da710fe8a2c7834f"},
		{"Base Sepolia USDC's domain separator is the on-chain value", NetworkBaseSepolia, "0x71f17a3b2ff373b803d70a5a07c046c1a2bc8e89c09ef722fcb047abe94c9818"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			a, ok := USDC(tc.network)
			if !ok {
				t.Fatalf("no USDC for %s", tc.network)
			}
			id, err := ChainID(tc.network)
			if err != nil {
				t.Fatal(err)
			}
			got := DomainSeparator(id, a.Name, a.Version, common.HexToAddress(a.Address))
			if got.Hex() != tc.want {
				t.Fatalf("got %s, want %s", got.Hex(), tc.want)
			}
		})
	}
}

// typedData builds the same message for go-ethereum's generic EIP-712
// implementation, an independent computation of the digest.
func typedData(chainID *big.Int, name, version string, token common.Address, a Authorization) apitypes.TypedData {
	return apitypes.TypedData{
		Types: apitypes.Types{
			"EIP712Domain": {{Name: "name", Type: "string"}, {Name: "version", Type: "string"}, {Name: "chainId", Type: "uint256"}, {Name: "verifyingContract", Type: "address"}},
			"TransferWithAuthorization": {{Name: "from", Type: "address"}, {Name: "to", Type: "address"}, {Name: "value", Type: "uint256"},
				{Name: "validAfter", Type: "uint256"}, {Name: "validBefore", Type: "uint256"}, {Name: "nonce", Type: "bytes32"}},
		},
		PrimaryType: "TransferWithAuthorization",
		Domain:      apitypes.TypedDataDomain{Name: name, Version: version, ChainId: (*math.HexOrDecimal256)(chainID), VerifyingContract: token.Hex()},
		Message:     apitypes.TypedDataMessage{"from": a.From, "to": a.To, "value": a.Value, "validAfter": a.ValidAfter, "validBefore": a.ValidBefore, "nonce": a.Nonce},
	}
}

var sampleAuth = Authorization{
	From:        "0x857b06519E91e3A54538791bDbb0E22373e36b66",
	To:          "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
	Value:       "20000",
	ValidAfter:  "1740672089",
	ValidBefore: "1740672154",
	Nonce:       "0xf3746613c2d920b5fdabc0856f2aeb2d4f88ee6037b8cc5d04a71a4462f13480",
}

func TestDigestAgreesWithGoEthereumTypedData(t *testing.T) {
	big1 := "115792089237316195423570985008687907853269984665640564039457584007913129639935"
	for _, tc := range []struct {
		desc    string
		chainID int64
		name    string
		version string
		auth    Authorization
	}{
		{"a Base USDC authorization", 8453, "USD Coin", "2", sampleAuth},
		{"a Base Sepolia authorization", 84532, "USDC", "2", sampleAuth},
		{"a devnet authorization with maximal uint256 values", 1337, "USD Coin", "2",
			Authorization{From: sampleAuth.From, To: sampleAuth.To, Value: big1, ValidAfter: "0", ValidBefore: big1, Nonce: "0x" + strings.Repeat("ff", 32)}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			token := common.HexToAddress("0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913")
			id := big.NewInt(tc.chainID)
			got, err := TransferWithAuthorizationDigest(id, tc.name, tc.version, token, tc.auth)
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := apitypes.TypedDataAndHash(typedData(id, tc.name, tc.version, token, tc.auth))
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got[:]) != hex.EncodeToString(want) {
				t.Fatalf("digest %x, go-ethereum computes %x", got, want)
			}
		})
	}
}

func testKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := crypto.HexToECDSA("4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func devnetRequirements() PaymentRequirements {
	return PaymentRequirements{
		Scheme: SchemeExact, Network: NetworkBaseSepolia, Amount: "20000",
		Asset: "0x036CbD53842c5426634e7929541eC2318f3dCF7e", PayTo: "0x209693bc6afc0c5328ba36faf03c514ef312287c",
		MaxTimeoutSeconds: 60, Extra: map[string]any{"name": "USDC", "version": "2"},
	}
}

func TestSignExactEVMProducesWhatTheOfficialClientSends(t *testing.T) {
	key := testKey(t)
	req := devnetRequirements()
	now := time.Unix(1_800_000_000, 0)
	res := &Resource{URL: "https://api.example/verify/schema"}
	p, err := SignExactEVM(key, req, res, now)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := ParseExactEVMPayload(p.Payload)
	if err != nil {
		t.Fatalf("our own payload does not parse: %v", err)
	}
	a := ep.Authorization
	checks := []struct {
		desc      string
		got, want string
	}{
		{"from is the signer's checksummed address", a.From, crypto.PubkeyToAddress(key.PublicKey).Hex()},
		{"to is payTo, checksummed", a.To, "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"},
		{"value is the amount", a.Value, "20000"},
		{"validAfter is ten minutes before now", a.ValidAfter, "1799999400"},
		{"validBefore is now plus maxTimeoutSeconds", a.ValidBefore, "1800000060"},
		{"the signature is 65 bytes of 0x hex", func() string { return itoa(len(ep.Signature)) }(), "132"},
		{"v is 27 or 28", func() string { v := ep.Signature[130:]; return itoa(boolInt(v == "1b" || v == "1c")) }(), "1"},
		{"the nonce is 32 bytes of 0x hex", itoa(len(a.Nonce)), "66"},
		{"the version is 2", itoa(p.X402Version), "2"},
		{"resource is carried", p.Resource.URL, res.URL},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %s, want %s", c.desc, c.got, c.want)
		}
	}
	accepted, _ := json.Marshal(p.Accepted)
	orig, _ := json.Marshal(req)
	if string(accepted) != string(orig) {
		t.Errorf("accepted is not an unmodified copy: %s vs %s", accepted, orig)
	}
	h, err := EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := DecodePaymentSignature(h); err != nil || string(back.Payload) != string(p.Payload) {
		t.Fatalf("the payment does not survive its header: %v", err)
	}
	signer, err := RecoverExactEVM(req, ep)
	if err != nil {
		t.Fatal(err)
	}
	if signer != crypto.PubkeyToAddress(key.PublicKey) {
		t.Fatalf("recovered %s, want the signer", signer.Hex())
	}
	q, err := SignExactEVM(key, req, res, now)
	if err != nil {
		t.Fatal(err)
	}
	eq, _ := ParseExactEVMPayload(q.Payload)
	if eq.Authorization.Nonce == a.Nonce {
		t.Fatal("two payments share a nonce")
	}
}

func itoa(i int) string { return big.NewInt(int64(i)).String() }
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestRecoverAuthorizer(t *testing.T) {
	key := testKey(t)
	signer := crypto.PubkeyToAddress(key.PublicKey)
	digest := crypto.Keccak256Hash([]byte("digest"))
	sig01, err := crypto.Sign(digest[:], key)
	if err != nil {
		t.Fatal(err)
	}
	with := func(f func(s []byte)) []byte {
		s := append([]byte(nil), sig01...)
		f(s)
		return s
	}
	highS := with(func(s []byte) {
		sv := new(big.Int).SetBytes(s[32:64])
		new(big.Int).Sub(secp256k1N, sv).FillBytes(s[32:64])
		s[64] ^= 1
	})
	for _, tc := range []struct {
		desc    string
		sig     []byte
		wantErr bool
	}{
		{"a signature with v 0/1 recovers the signer", sig01, false},
		{"a signature with v 27/28 recovers the signer", with(func(s []byte) { s[64] += 27 }), false},
		{"a high-s twin of a valid signature is refused as malleable", highS, true},
		{"a recovery id of 2 is refused", with(func(s []byte) { s[64] = 2 }), true},
		{"a recovery id of 29 is refused", with(func(s []byte) { s[64] = 29 }), true},
		{"a zero r is refused", with(func(s []byte) { clear(s[:32]) }), true},
		{"a 64-byte signature is refused", sig01[:64], true},
		{"a 66-byte signature is refused", append(append([]byte(nil), sig01...), 0), true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := RecoverAuthorizer(digest, tc.sig)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("accepted, recovered %s", got.Hex())
				}
				if !errors.Is(err, ErrInvalidSignature) || ReasonOf(err) != ReasonExactEVMSignature {
					t.Fatalf("error %v is not an invalid signature", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != signer {
				t.Fatalf("recovered %s, want %s", got.Hex(), signer.Hex())
			}
		})
	}
	// The high-s twin really is the same signer's signature: go-ethereum's
	// unchecked recovery returns the signer, so only our rule refuses it.
	raw := append([]byte(nil), highS...)
	pub, err := crypto.SigToPub(digest[:], raw)
	if err != nil || crypto.PubkeyToAddress(*pub) != signer {
		t.Fatalf("the malleable twin does not recover to the signer (%v); the test proves nothing", err)
	}
}

var bigOne = big.NewInt(1)

func TestDomainSeparatorNeverPanics(t *testing.T) {
	for _, tc := range []struct {
		desc string
		id   *big.Int
	}{
		{"a chain id beyond uint256 gives a separator instead of a panic", new(big.Int).Lsh(big.NewInt(1), 300)},
		{"a negative chain id gives a separator instead of a panic", big.NewInt(-1)},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if DomainSeparator(tc.id, "n", "v", common.Address{}) == (common.Hash{}) {
				t.Fatal("zero separator")
			}
		})
	}
	if _, err := TransferWithAuthorizationDigest(big.NewInt(-1), "n", "v", common.Address{}, sampleAuth); err == nil {
		t.Fatal("a negative chain id was accepted for a digest")
	}
}

// TestERC1271AcceptsOnlyTheExactWord: isValidSignature's yes is a first
// ABI word of the magic value and 28 zero bytes (what follows it is
// ignored, as the token's ret.length >= 32 check ignores it). Its first
// four bytes alone are also the call's selector, so an address echoing
// its calldata (the identity precompile) answers them for any signature.
func TestERC1271AcceptsOnlyTheExactWord(t *testing.T) {
	word := common.FromHex("0x1626ba7e00000000000000000000000000000000000000000000000000000000")
	echo := common.FromHex("0x1626ba7e" + strings.Repeat("ab", 32) + strings.Repeat("00", 96))
	for _, tc := range []struct {
		desc string
		out  []byte
		want bool
	}{
		{"the ABI-encoded bytes4 magic value", word, true},
		{"an echo of the calldata (selector first)", echo, false},
		{"the magic value alone, unpadded", word[:4], false},
		{"the word with return data after it, which the token ignores", append(append([]byte{}, word...), echo...), true},
		{"the magic value with a non-zero tail", append(append([]byte{}, word[:31]...), 1), false},
		{"another value", common.FromHex("0xffffffff00000000000000000000000000000000000000000000000000000000"), false},
		{"no answer", nil, false},
	} {
		if got := ERC1271Accepts(tc.out); got != tc.want {
			t.Errorf("%s: ERC1271Accepts = %v, want %v", tc.desc, got, tc.want)
		}
	}
}
