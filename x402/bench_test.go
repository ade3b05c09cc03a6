package x402

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// BenchmarkDecodePaymentSignature is the gateway's cost to decode and check
// one PAYMENT-SIGNATURE header made by the official client.
func BenchmarkDecodePaymentSignature(b *testing.B) {
	h := loadOfficial(b, "base-sepolia.json").Header
	b.ReportAllocs()
	b.SetBytes(int64(len(h)))
	for b.Loop() {
		if _, err := DecodePaymentSignature(h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecoverExactEVM is the signature cost of verifying one payment:
// payload parse, EIP-712 digest and ecrecover.
func BenchmarkRecoverExactEVM(b *testing.B) {
	p, err := DecodePaymentSignature(loadOfficial(b, "base-sepolia.json").Header)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		ep, err := ParseExactEVMPayload(p.Payload)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := RecoverExactEVM(p.Accepted, ep); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTransferWithAuthorizationDigest is the EIP-712 digest alone.
func BenchmarkTransferWithAuthorizationDigest(b *testing.B) {
	a, _ := USDC(NetworkBase)
	id, _ := ChainID(NetworkBase)
	token := [20]byte{1}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := TransferWithAuthorizationDigest(id, a.Name, a.Version, token, sampleAuth); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckExactEVM is every off-chain check of one payment,
// signature recovery included.
func BenchmarkCheckExactEVM(b *testing.B) {
	p, err := DecodePaymentSignature(loadOfficial(b, "base-sepolia.json").Header)
	if err != nil {
		b.Fatal(err)
	}
	ep, _ := ParseExactEVMPayload(p.Payload)
	vb, _ := parseUint256(ep.Authorization.ValidBefore)
	now := time.Unix(vb.Int64()-60, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := CheckExactEVM(p, p.Accepted, now); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadFacilitatorRequest is a facilitator's cost to read and check
// one /verify or /settle request body (a facilitator run apart from the
// gateway reads two per paid call).
func BenchmarkReadFacilitatorRequest(b *testing.B) {
	body := `{"x402Version":2,"paymentPayload":` + validPayloadJSON + `,"paymentRequirements":{"scheme":"exact","network":"eip155:84532","amount":"20000","asset":"0x036CbD53842c5426634e7929541eC2318f3dCF7e","payTo":"0x209693bc6afc0c5328ba36faf03c514ef312287c","maxTimeoutSeconds":300,"extra":{"name":"USDC","version":"2"}}}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/verify", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if _, err := readFacilitatorRequest(httptest.NewRecorder(), r); err != nil {
			b.Fatal(err)
		}
	}
}
