package x402

import (
	"encoding/base64"
	"strings"
	"testing"
)

// The gate reads an exact EVM payment's authorization from the parse that
// decoded the payment: reading it costs the values (the numbers, the
// nonce), not a second parse of the payload. Before, ExactEVMValues parsed
// the payload's bytes again, some forty allocations per paid call.
func TestPaymentReadsTheAuthorizationFromItsParse(t *testing.T) {
	pay, err := DecodePayment(base64.StdEncoding.EncodeToString([]byte(validPayloadJSON)))
	if err != nil {
		t.Fatal(err)
	}
	want, err := ExactEVMValues(pay.PaymentPayload)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pay.ExactEVMValues()
	if err != nil || got.Nonce != want.Nonce || got.ValidBefore.Cmp(want.ValidBefore) != 0 || got.From != want.From {
		t.Fatalf("read %+v, %v; want %+v", got, err, want)
	}
	// parseUint256 makes each of the three numbers (a big.Int and its
	// words), decodeHex the nonce: the values alone are about ten.
	const budget = 14
	if n := testing.AllocsPerRun(50, func() { pay.ExactEVMValues() }); n > budget {
		t.Fatalf("reading the authorization: %v allocations, want at most %d (no second parse)", n, budget)
	}
	// Refusals are the same as ExactEVMValues', from the same parse.
	permit2 := strings.Replace(validPayloadJSON, `"payload":{`, `"payload":{"permit2Authorization":{"nonce":"7"},`, 1)
	pay, err = DecodePayment(base64.StdEncoding.EncodeToString([]byte(permit2)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pay.ExactEVMValues(); ReasonOf(err) != ReasonUnsupportedPayloadType {
		t.Fatalf("permit2 payload: %v; want %s", err, ReasonUnsupportedPayloadType)
	}
}
