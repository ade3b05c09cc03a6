package walletauth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode"
)

// FuzzParseWalletAuth feeds arbitrary header values to the parser: it must
// never panic, and whatever it accepts must survive an encode and parse
// round trip unchanged (one header, one meaning) and verify without panic.
func FuzzParseWalletAuth(f *testing.F) {
	e, _ := New(Request{Method: "POST", URL: "https://verifier.example/verify/schema", AgentID: "seller-7", Statement: "hi", Now: time.Unix(1_800_000_000, 0), Nonce: "abcdefghijklmnop1234"})
	e.Sign(testKey)
	good, _ := e.Encode()
	f.Add(good)
	f.Add("")
	f.Add("e30=")                                                     // {}
	f.Add(base64.StdEncoding.EncodeToString([]byte(`{"domain":1}`)))  // wrong type
	f.Add(base64.StdEncoding.EncodeToString([]byte(`{"a":1,"a":2}`))) // duplicate
	f.Add(base64.StdEncoding.EncodeToString([]byte(`[1,2,3]`)))       // array
	f.Add(base64.StdEncoding.EncodeToString([]byte("{\"statement\":\"\xff\"}")))
	f.Add("!!!!")
	var m map[string]any
	raw, _ := base64.StdEncoding.DecodeString(good)
	json.Unmarshal(raw, &m)
	m["agent_id"] = " seller-7 " // an end HTTP would trim
	spaced, _ := json.Marshal(m)
	f.Add(base64.StdEncoding.EncodeToString(spaced))
	m["agent_id"] = "seller-7\u200b" // reads as seller-7
	invisible, _ := json.Marshal(m)
	f.Add(base64.StdEncoding.EncodeToString(invisible))
	v := &Verifier{Now: func() time.Time { return time.Unix(1_800_000_060, 0) }}
	f.Fuzz(func(t *testing.T, h string) {
		e, err := Parse(h)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("refusal %T is not *Error", err)
			}
			return
		}
		if id := strings.TrimSpace(e.AgentID); id != e.AgentID {
			t.Fatalf("accepted agent_id %q with space at an end: HTTP trims it to %q on the way upstream", e.AgentID, id)
		}
		for _, r := range e.AgentID {
			if !unicode.IsPrint(r) {
				t.Fatalf("accepted agent_id %q with %U, which is not printable: it could read as another id", e.AgentID, r)
			}
		}
		again, err := e.Encode()
		if err != nil {
			t.Fatalf("an accepted envelope does not encode: %v", err)
		}
		e2, err := Parse(again)
		if err != nil {
			t.Fatalf("an accepted envelope does not parse after encoding: %v", err)
		}
		if *e2 != *e || e2.Message() != e.Message() {
			t.Fatal("round trip changed the envelope")
		}
		v.VerifyEnvelope(context.Background(), e, Expect{Domain: e.Domain, Method: e.Method, Path: e.Path})
	})
}

// FuzzParseSIWX does the same for SIGN-IN-WITH-X values.
func FuzzParseSIWX(f *testing.F) {
	f.Add(siwxHeader(f, siwxProof(f, time.Unix(1_800_000_000, 0), nil)))
	f.Add("")
	f.Add("e30=")
	f.Add(base64.StdEncoding.EncodeToString([]byte(`{"resources":[1,{"a":[]}]}`)))
	f.Add(siwxHeader(f, siwxProof(f, time.Unix(1_800_000_000, 0), func(s *SIWX) { s.Resources = []string{"urn:x-wallet-auth:method:POST"} })))
	f.Add(siwxHeader(f, siwxProof(f, time.Unix(1_800_000_000, 0), func(s *SIWX) { s.Resources = []string{"Urn:X-Wallet-Auth:agent:a"} })))
	f.Fuzz(func(t *testing.T, h string) {
		s, err := ParseSIWX(h)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("refusal %T is not *Error", err)
			}
			return
		}
		// No accepted sign-in may carry X-Wallet-Auth's resources: its
		// text would then be an X-Wallet-Auth proof's too.
		for _, r := range s.Resources {
			if strings.HasPrefix(strings.ToLower(r), "urn:x-wallet-auth:") {
				t.Fatalf("accepted a sign-in listing X-Wallet-Auth resource %q", r)
			}
		}
		_ = s.Message()
	})
}
