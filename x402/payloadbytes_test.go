package x402

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A facilitator request's payment payload reaches the facilitator byte for
// byte as the gateway sent it (spacing, member order, number spellings),
// read from the one strict parse of the body; a payload spelt in another
// case is not the payload.
func TestFacilitatorRequestKeepsThePayloadBytes(t *testing.T) {
	payload := `{ "signature" : "0x2761789828d01010298d03ed01e5c0dec1bd88389d377b268229804566e76cf71a01879e155ae17682fa526d3e752b789f770d9d78a2b7716e9a2269845d67881b" ,"authorization":{"from":"0x2c7536E3605D9C16a7a3D7b1898e529396a65c23","to":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C","value":"20000","validAfter":"0","validBefore":"1795988428","nonce":"0x0157afa37b7b1d0b58ec4fa2b53f9a39bd5f3673c5268941314444823113d5b3","extra":1.50e0} }`
	accepted := `{"scheme":"exact","network":"eip155:84532","amount":"20000","asset":"0x036CbD53842c5426634e7929541eC2318f3dCF7e","payTo":"0x209693bc6afc0c5328ba36faf03c514ef312287c","maxTimeoutSeconds":300,"extra":{"name":"USDC","version":"2"}}`
	read := func(payment string) (FacilitatorRequest, error) {
		body := `{"x402Version":2,"paymentPayload":` + payment + `,"paymentRequirements":` + accepted + `}`
		r := httptest.NewRequest(http.MethodPost, "/verify", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		return readFacilitatorRequest(httptest.NewRecorder(), r)
	}
	req, err := read(`{"x402Version":2,"accepted":` + accepted + `,"payload":` + payload + `,"resource":{"url":"https://api.example/x"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if string(req.PaymentPayload.Payload) != payload {
		t.Fatalf("payload\n%s\nwant\n%s", req.PaymentPayload.Payload, payload)
	}
	if _, err := read(`{"x402Version":2,"accepted":` + accepted + `,"Payload":` + payload + `}`); err == nil {
		t.Fatal("a member Payload was read as the payload")
	}
	for _, obj := range []string{`[]`, `"payload"`, `{"payload":1}`, `{}`} {
		if b := payloadBytes([]byte(obj)); obj == `{"payload":1}` && string(b) != "1" || obj != `{"payload":1}` && b != nil {
			t.Fatalf("payloadBytes(%s) = %q", obj, b)
		}
	}
}

// FuzzPayloadBytes: for any object inside a document the strict parse
// accepts, payloadBytes finds the payload the strict parse of that object
// finds, byte for byte.
func FuzzPayloadBytes(f *testing.F) {
	f.Add(validPayloadJSON)
	f.Add(`{"payload":{"a":1},"PAYLOADX":2}`)
	f.Add(`{"payload" : [ 1 , 2 ] }`)
	f.Add(`{"Payload":{}}`)
	f.Add(`{"paylo\u0061d":{"x":"y"}}`)
	f.Fuzz(func(t *testing.T, obj string) {
		top, _, err := checkJSONObject([]byte(`{"p":` + obj + `}`))
		if err != nil || top == nil {
			return
		}
		m, inner, err := checkJSONObject([]byte(obj))
		if err != nil {
			return
		}
		if _, ok := m["payload"]; !ok {
			return
		}
		if got, want := payloadBytes([]byte(obj)), inner["payload"]; string(got) != string(want) {
			t.Fatalf("payloadBytes(%s) = %q, the strict parse %q", obj, got, want)
		}
	})
}
