package caddymodule

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
)

// kitBase64 models how the official @x402/svm facilitator reads
// payload.transaction: @solana/kit's getBase64Encoder().encode on Node
// (@solana/codecs-strings) checks the text with every "=" removed against
// the alphabet, then Buffer.from(text, "base64"), which stops at the first
// "=", drops a lone final character and ignores trailing bits.
func kitBase64(s string) ([]byte, bool) {
	for _, c := range strings.ReplaceAll(s, "=", "") {
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/') {
			return nil, false
		}
	}
	if i := strings.IndexByte(s, '='); i >= 0 {
		s = s[:i]
	}
	if len(s)%4 == 1 {
		s = s[:len(s)-1]
	}
	b, err := base64.RawStdEncoding.DecodeString(s)
	return b, err == nil
}

// fuzzSolanaTx is the smallest legacy transaction the gate decodes: the
// fee payer's empty signature slot, two account keys, one instruction
// (the spelling, not the transfer, is under test). 164 bytes, so its
// base64 ends in "==" and has trailing bits to set.
func fuzzSolanaTx() []byte {
	b := []byte{1}
	b = append(b, make([]byte, 64)...) // fee payer's signature slot
	b = append(b, 1, 0, 1, 2)          // header; 2 account keys
	b = append(b, make([]byte, 32)...) // key 0
	for i := range 32 {                // key 1
		b = append(b, byte(i+1))
	}
	b = append(b, make([]byte, 32)...) // blockhash
	b = append(b, 1, 1, 0, 0)          // program 1, no accounts, no data
	return b
}

// FuzzSolanaClaimAgreesWithTheOfficialDecoder: the gate accepts a
// payload.transaction only in the canonical base64 of the bytes it reads
// (one spelling per transaction), the official facilitator reads that
// spelling as the very same bytes, and the claim names their message. So
// no transaction the facilitator settles can be claimed twice under two
// spellings: any other spelling is refused before the claim.
func FuzzSolanaClaimAgreesWithTheOfficialDecoder(f *testing.F) {
	tx := fuzzSolanaTx()
	canon := base64.StdEncoding.EncodeToString(tx)
	network := x402.NetworkSolanaDevnet
	payload := func(t testing.TB, s string) x402.PaymentPayload {
		b, err := json.Marshal(map[string]string{"transaction": s})
		if err != nil {
			t.Fatal(err)
		}
		return x402.PaymentPayload{Payload: b}
	}
	read, err := readSVMPayment(payload(f, canon))
	if err != nil {
		f.Fatalf("the canonical spelling: %v", err)
	}
	want := svmClaimKey(network, read)
	if keys, _ := claimKeys("header", x402.PaymentRequirements{Network: network}, nil, read); len(keys) != 2 || keys[1] != want {
		f.Fatalf("claim keys %q, want the header's and %s", keys, want)
	}
	f.Add(canon)
	f.Add(" " + canon)
	f.Add(canon + "A")
	for _, s := range respellings(canon) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := readSVMPayment(payload(t, s))
		if err != nil {
			return // refused before the claim: claimed under nothing
		}
		if base64.StdEncoding.EncodeToString(got.Raw) != s {
			t.Fatalf("the gate accepts %q, not the canonical spelling of what it reads", s)
		}
		if kit, ok := kitBase64(s); !ok || !bytes.Equal(kit, got.Raw) {
			t.Fatalf("the gate reads %q as other bytes than the official facilitator", s)
		}
		if bytes.Equal(got.Raw, tx) && svmClaimKey(network, got) != want {
			t.Fatalf("the transaction is claimed as %s, want %s", svmClaimKey(network, got), want)
		}
	})
}
