package x402

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// officialVector is a PAYMENT-SIGNATURE header made by the official x402
// TypeScript client (testdata/official-client/gen.mjs).
type officialVector struct {
	Address string `json:"address"`
	Header  string `json:"header"`
}

func loadOfficial(t testing.TB, name string) officialVector {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "official-client", name))
	if err != nil {
		t.Fatal(err)
	}
	var v officialVector
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// validPayloadJSON is the official client's shape with placeholder values.
const validPayloadJSON = `{"x402Version":2,"payload":{"authorization":{"from":"0x2c7536E3605D9C16a7a3D7b1898e529396a65c23","to":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C","value":"20000","validAfter":"0","validBefore":"1795988428","nonce":"0x0157afa37b7b1d0b58ec4fa2b53f9a39bd5f3673c5268941314444823113d5b3"},"signature":"0x2761789828d01010298d03ed01e5c0dec1bd88389d377b268229804566e76cf71a01879e155ae17682fa526d3e752b789f770d9d78a2b7716e9a2269845d67881b"},"resource":{"url":"https://api.example/verify/schema"},"accepted":{"scheme":"exact","network":"eip155:84532","amount":"20000","asset":"0x036CbD53842c5426634e7929541eC2318f3dCF7e","payTo":"0x209693bc6afc0c5328ba36faf03c514ef312287c","maxTimeoutSeconds":300,"extra":{"name":"USDC","version":"2"}}}`

func TestOfficialClientHeadersDecodeAndRecover(t *testing.T) {
	for _, tc := range []struct {
		desc, file string
	}{
		{"a Base Sepolia payment from the official TypeScript client decodes and recovers to its signer", "base-sepolia.json"},
		{"a Base payment from the official TypeScript client decodes and recovers to its signer", "base.json"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			v := loadOfficial(t, tc.file)
			p, err := DecodePaymentSignature(v.Header)
			if err != nil {
				t.Fatal(err)
			}
			ep, err := ParseExactEVMPayload(p.Payload)
			if err != nil {
				t.Fatal(err)
			}
			signer, err := RecoverExactEVM(p.Accepted, ep)
			if err != nil {
				t.Fatal(err)
			}
			if signer != common.HexToAddress(v.Address) {
				t.Fatalf("recovered %s, the client signed as %s", signer.Hex(), v.Address)
			}
			// The whole off-chain check passes just before expiry.
			vb, _ := parseUint256(ep.Authorization.ValidBefore)
			now := time.Unix(vb.Int64()-60, 0)
			c, err := CheckExactEVM(p, p.Accepted, now)
			if err != nil {
				t.Fatalf("check refused the official payment: %v", err)
			}
			if !c.Recovered {
				t.Fatal("a 65-byte EOA signature was not recovered")
			}
		})
	}
}

func TestEncodeHeaderRoundTrip(t *testing.T) {
	in := PaymentRequired{X402Version: 2, Error: "Payment required", Resource: Resource{URL: "https://a.example/x?a=1&b=<2>"},
		Accepts: []PaymentRequirements{devnetRequirements()}}
	h, err := EncodeHeader(in)
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(h, "-_ \n") || len(h)%4 != 0 {
		t.Fatalf("not standard padded base64: %q", h)
	}
	raw, _ := base64.StdEncoding.DecodeString(h)
	if strings.Contains(string(raw), `\u003c`) {
		t.Error("HTML characters were escaped; the header should carry plain JSON")
	}
	var out PaymentRequired
	if err := DecodeHeader(h, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip changed the value:\n%+v\n%+v", in, out)
	}
	if _, err := EncodeHeader(map[string]string{"x": strings.Repeat("a", MaxHeaderBytes)}); !errors.Is(err, ErrHeaderTooLarge) {
		t.Fatalf("an oversized value encoded: %v", err)
	}
}

func TestDecodeHeaderRefusesNonCanonicalEncodings(t *testing.T) {
	obj := `{"a":"??>"}` // encodes with '+' or '/' and padding
	std := b64(obj)
	if !strings.ContainsAny(std, "+/") || !strings.HasSuffix(std, "=") {
		t.Fatalf("test input %q does not exercise the alphabet and padding", std)
	}
	urlSafe := base64.URLEncoding.EncodeToString([]byte(obj))
	// "{}" is e30=; flipping the low bits of the last data character gives
	// a different spelling of the same bytes.
	for _, tc := range []struct {
		desc string
		h    string
		want error
	}{
		{"the URL-safe alphabet is refused", urlSafe, ErrHeaderEncoding},
		{"missing padding is refused", strings.TrimRight(std, "="), ErrHeaderEncoding},
		{"a line break inside is refused", std[:4] + "\n" + std[4:], ErrHeaderEncoding},
		{"a carriage return inside is refused", std[:4] + "\r\n" + std[4:], ErrHeaderEncoding},
		{"leading space is refused", " " + std, ErrHeaderEncoding},
		{"a trailing space is refused", std + " ", ErrHeaderEncoding},
		{"padding in the middle is refused", "e30=e30=", ErrHeaderEncoding},
		{"non-zero trailing bits are refused", "e31=", ErrHeaderEncoding},
		{"an empty header is refused", "", ErrHeaderEncoding},
		{"a header over MaxHeaderBytes is refused before decoding", strings.Repeat("A", MaxHeaderBytes+4), ErrHeaderTooLarge},
		{"bytes that are not UTF-8 are refused", base64.StdEncoding.EncodeToString([]byte("{\"a\":\"\xff\"}")), ErrHeaderJSON},
		{"text that is not JSON is refused", b64("hello"), ErrHeaderJSON},
		{"a JSON array is refused", b64(`[1,2]`), ErrHeaderJSON},
		{"a JSON string is refused", b64(`"x"`), ErrHeaderJSON},
		{"trailing data after the object is refused", b64(`{} {}`), ErrHeaderJSON},
		{"a repeated member name is refused", b64(`{"a":1,"a":2}`), ErrHeaderJSON},
		{"member names differing only in case are refused", b64(`{"payTo":"x","PAYTO":"y"}`), ErrHeaderJSON},
		{"member names equal after unescaping are refused", b64(`{"to":"x","\u0074o":"y"}`), ErrHeaderJSON},
		{"member names equal under Unicode folding are refused", b64(`{"k":1,"\u212a":2}`), ErrHeaderJSON},
		{"a repeated name in a nested object is refused", b64(`{"p":{"a":{"x":1,"x":1}}}`), ErrHeaderJSON},
		{"a repeated name in an object inside an array is refused", b64(`{"p":[{"x":1},{"y":1,"y":2}]}`), ErrHeaderJSON},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			var v map[string]any
			err := DecodeHeader(tc.h, &v)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			var pe *PaymentError
			if !errors.As(err, &pe) || pe.Reason != ReasonInvalidPayload {
				t.Fatalf("error %v is not a *PaymentError with reason invalid_payload", err)
			}
		})
	}
	t.Run("the same names in sibling objects are accepted", func(t *testing.T) {
		var v map[string]any
		if err := DecodeHeader(b64(`{"a":{"x":1},"b":{"x":2},"c":[{"x":1},{"x":2}],"s":"{\"x\":1,\"x\":2}"}`), &v); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a wide object with distinct names is accepted and a late duplicate is found", func(t *testing.T) {
		var sb strings.Builder
		sb.WriteString("{")
		for i := 0; i < 100; i++ {
			sb.WriteString(`"k` + itoa(i) + `":1,`)
		}
		var v map[string]any
		if err := DecodeHeader(b64(sb.String()+`"end":1}`), &v); err != nil {
			t.Fatal(err)
		}
		if err := DecodeHeader(b64(sb.String()+`"k7":1}`), &v); !errors.Is(err, ErrHeaderJSON) {
			t.Fatalf("duplicate after 100 members: %v", err)
		}
	})
}

func TestDecodePaymentSignature(t *testing.T) {
	var base map[string]any
	if err := json.Unmarshal([]byte(validPayloadJSON), &base); err != nil {
		t.Fatal(err)
	}
	// edit returns the base payload with path set to v (delete when v is
	// the string "<delete>").
	edit := func(v any, path ...string) string {
		var m map[string]any
		json.Unmarshal([]byte(validPayloadJSON), &m)
		cur := m
		for _, p := range path[:len(path)-1] {
			cur = cur[p].(map[string]any)
		}
		if v == "<delete>" {
			delete(cur, path[len(path)-1])
		} else {
			cur[path[len(path)-1]] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	for _, tc := range []struct {
		desc      string
		json      string
		want      error
		wantField string
	}{
		{"the official client's shape is accepted", validPayloadJSON, nil, ""},
		{"unknown members are ignored at the top level", edit("x", "futureMember"), nil, ""},
		{"unknown members are ignored inside accepted", edit(true, "accepted", "futureMember"), nil, ""},
		{"extensions are accepted as an object", edit(map[string]any{"bazaar": map[string]any{"info": 1}}, "extensions"), nil, ""},
		{"resource may be absent", edit("<delete>", "resource"), nil, ""},
		{"maxTimeoutSeconds may be absent", edit("<delete>", "accepted", "maxTimeoutSeconds"), nil, ""},
		{"version 1 is an unsupported version", edit(1, "x402Version"), ErrUnsupportedVersion, "x402Version"},
		{"version 3 is an unsupported version", edit(3, "x402Version"), ErrUnsupportedVersion, "x402Version"},
		{"a missing version is an unsupported version", edit("<delete>", "x402Version"), ErrUnsupportedVersion, "x402Version"},
		{"the version as a string is an unsupported version", edit("2", "x402Version"), ErrUnsupportedVersion, "x402Version"},
		{"the version as 2.0 is an unsupported version", strings.Replace(validPayloadJSON, `"x402Version":2`, `"x402Version":2.0`, 1), ErrUnsupportedVersion, "x402Version"},
		{"a missing accepted is invalid", edit("<delete>", "accepted"), ErrInvalidPayment, "accepted"},
		{"accepted that is not an object is invalid", edit("x", "accepted"), ErrInvalidPayment, "accepted"},
		{"a missing scheme is invalid", edit("<delete>", "accepted", "scheme"), ErrInvalidPayment, "accepted.scheme"},
		{"an empty scheme is invalid", edit("", "accepted", "scheme"), ErrInvalidPayment, "accepted.scheme"},
		{"a numeric amount is invalid", edit(20000, "accepted", "amount"), ErrInvalidPayment, "accepted.amount"},
		{"an amount with a leading zero is invalid", edit("020000", "accepted", "amount"), ErrInvalidPayment, "accepted.amount"},
		{"a decimal amount is invalid", edit("0.02", "accepted", "amount"), ErrInvalidPayment, "accepted.amount"},
		{"a v1 network name is invalid", edit("base-sepolia", "accepted", "network"), ErrInvalidPayment, "accepted.network"},
		{"a missing asset is invalid", edit("<delete>", "accepted", "asset"), ErrInvalidPayment, "accepted.asset"},
		{"a missing payTo is invalid", edit("<delete>", "accepted", "payTo"), ErrInvalidPayment, "accepted.payTo"},
		{"payTo spelled in another case is not payTo", strings.Replace(validPayloadJSON, `"payTo"`, `"PayTo"`, 1), ErrInvalidPayment, "accepted.payTo"},
		{"a fractional maxTimeoutSeconds is invalid", edit(1.5, "accepted", "maxTimeoutSeconds"), ErrInvalidPayment, "accepted.maxTimeoutSeconds"},
		{"a negative maxTimeoutSeconds is invalid", edit(-1, "accepted", "maxTimeoutSeconds"), ErrInvalidPayment, "accepted.maxTimeoutSeconds"},
		{"extra that is not an object is invalid", edit([]any{1}, "accepted", "extra"), ErrInvalidPayment, "accepted.extra"},
		{"a missing payload is invalid", edit("<delete>", "payload"), ErrInvalidPayment, "payload"},
		{"a payload that is a string is invalid", edit("0xabc", "payload"), ErrInvalidPayment, "payload"},
		{"a resource that is not an object is invalid", edit("https://x", "resource"), ErrInvalidPayment, "resource"},
		{"a resource url that is not a string is invalid", edit(map[string]any{"url": 5}, "resource"), ErrInvalidPayment, "resource.url"},
		{"extensions that are not an object are invalid", edit("x", "extensions"), ErrInvalidPayment, "extensions"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			p, err := DecodePaymentSignature(b64(tc.json))
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				if p.X402Version != 2 || p.Accepted.Amount != "20000" || len(p.Payload) == 0 {
					t.Fatalf("decoded %+v", p)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			var pe *PaymentError
			errors.As(err, &pe)
			if pe.Field != tc.wantField {
				t.Errorf("field %q, want %q", pe.Field, tc.wantField)
			}
			wantReason := ReasonInvalidPayload
			if tc.want == ErrUnsupportedVersion {
				wantReason = ReasonInvalidX402Version
			}
			if pe.Reason != wantReason {
				t.Errorf("reason %q, want %q", pe.Reason, wantReason)
			}
		})
	}
}

func TestDecodePaymentSignatureKeepsPayloadAndNumbersExact(t *testing.T) {
	in := strings.Replace(validPayloadJSON, `"extra":{`, `"extra":{"n":1.50000000000000000001,`, 1)
	p, err := DecodePaymentSignature(b64(in))
	if err != nil {
		t.Fatal(err)
	}
	var whole map[string]json.RawMessage
	json.Unmarshal([]byte(in), &whole)
	if string(p.Payload) != string(whole["payload"]) {
		t.Errorf("payload changed: %s", p.Payload)
	}
	out, _ := json.Marshal(p.Accepted)
	if !strings.Contains(string(out), `"n":1.50000000000000000001`) {
		t.Errorf("a number in extra was rounded: %s", out)
	}
	// An integer a double cannot hold is read differently by JavaScript
	// peers and by Go; it is refused rather than passed on.
	big := strings.Replace(validPayloadJSON, `"extra":{`, `"extra":{"big":123456789012345678901234567890,`, 1)
	if _, err := DecodePaymentSignature(b64(big)); err == nil || !strings.Contains(err.Error(), "accepted.extra.big") {
		t.Errorf("an unsafe integer in extra: %v", err)
	}
}

func TestErrorsNeverEchoTheInput(t *testing.T) {
	const marker = "SECRETMARKER"
	for _, in := range []string{
		strings.Replace(validPayloadJSON, `"scheme":"exact"`, `"scheme":5,"`+marker+`":1`, 1),
		strings.Replace(validPayloadJSON, `"amount":"20000"`, `"amount":"`+marker+`"`, 1),
		strings.Replace(validPayloadJSON, `"network":"eip155:84532"`, `"network":"`+marker+`"`, 1),
		`{"x402Version":"` + marker + `"}`,
		`{"` + marker + `":1,"` + marker + `":2}`,
		marker,
	} {
		_, err := DecodePaymentSignature(b64(in))
		if err == nil {
			t.Fatalf("accepted %s", in)
		}
		if strings.Contains(err.Error(), marker) {
			t.Errorf("error echoes the input: %v", err)
		}
	}
}

func TestParsePaymentPayloadAppliesTheHeaderRules(t *testing.T) {
	good, err := json.Marshal(PaymentPayload{X402Version: 2, Accepted: PaymentRequirements{Scheme: "exact", Network: NetworkBase, Amount: "1", Asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", PayTo: "0x1111111111111111111111111111111111111111", MaxTimeoutSeconds: 60}, Payload: json.RawMessage(`{"signature":"0x00"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParsePaymentPayload(good); err != nil {
		t.Fatalf("a well-formed payload was refused: %v", err)
	}
	cases := []struct {
		desc string
		data []byte
	}{
		{"a member name twice is refused", []byte(strings.Replace(string(good), `"x402Version":2`, `"x402Version":2,"x402Version":2`, 1))},
		{"member names differing only in case are refused", []byte(strings.Replace(string(good), `{"signature"`, `{"Signature":"0x01","signature"`, 1))},
		{"invalid UTF-8 is refused", append([]byte(`{"x402Version":2,"x":"`), 0xff, '"', '}')},
		{"more than the header limit is refused", []byte(`{"x402Version":2,"pad":"` + strings.Repeat("a", MaxHeaderBytes) + `"}`)},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			if _, err := ParsePaymentPayload(tc.data); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
