package receipt_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/aovhq/aov/receipt"
)

// A signer attaches an attestation to a response; anyone holding the public
// key checks it, and any change to the response breaks it.
func Example() {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize))
	pub := priv.Public().(ed25519.PublicKey)

	resp := []byte(`{"result":"pass","output_hash":"ab12","verified_at":"2026-11-29T21:22:28.123456+00:00","verify":{"key_version":"k1"}}`)
	att, _ := receipt.Sign(priv, receipt.ContextVerify, "k1", "2026-11-29T21:22:28.123456+00:00", resp)
	a, _ := json.Marshal(att)
	signed := append(append(resp[:len(resp)-1:len(resp)-1], `,"attestation":`...), append(a, '}')...)

	keys := receipt.SingleKey("", pub)
	fmt.Println(receipt.VerifyReceipt(signed, keys, ""))

	forged := bytes.Replace(signed, []byte(`"pass"`), []byte(`"fail"`), 1)
	fmt.Println(receipt.VerifyReceipt(forged, keys, ""))
	// Output:
	// <nil>
	// signature does not match
}

// The signed document is the canonical form of five keys around the
// response.
func ExampleSigningInput() {
	in, _ := receipt.SigningInput(receipt.ContextVerify, "k1", "2026-11-29T21:22:28.123456+00:00",
		[]byte(`{"total": 135.0, "result": "fail"}`))
	fmt.Println(string(in))
	// Output:
	// {"algorithm":"Ed25519","attested_at":"2026-11-29T21:22:28.123456+00:00","context":"json-schema-verifier/verify-schema-attestation/v1","key_version":"k1","response":{"result":"fail","total":135}}
}

// Keys come from the agent card; every key version ever used is listed.
func ExampleKeysFromCard() {
	pub := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize)).Public().(ed25519.PublicKey)
	card := []byte(`{"capabilities":{"extensions":[{"uri":"urn:json-schema-verifier:extension:attestation:v1",
	  "params":{"currentKeyVersion":"k2","publicKeys":[
	    {"keyVersion":"k1","algorithm":"Ed25519","publicKey":"` + base64.StdEncoding.EncodeToString(pub) + `","publicKeyEncoding":"base64","status":"retired"},
	    {"keyVersion":"k2","algorithm":"Ed25519","publicKey":"` + base64.StdEncoding.EncodeToString(pub) + `","publicKeyEncoding":"base64","status":"current"}]}}]}}`)
	keys, err := receipt.KeysFromCard(card)
	fmt.Println(keys.Versions(), keys.Current(), err)
	// Output:
	// [k1 k2] k2 <nil>
}

// Hashes are lowercase hex SHA-256 of the canonical bytes.
func ExampleAppendCanonical() {
	c, _ := receipt.AppendCanonical(nil, map[string]any{"b": json.Number("10.0"), "a": []any{1e21, 1e-7, "café"}})
	fmt.Println(string(c))
	fmt.Println(receipt.Hash(c))
	// Output:
	// {"a":[1e+21,1e-7,"café"],"b":10}
	// 49cd891f336dc8d98dfc638d6af02e03d3858ec54e6810636b75c1114775e88f
}
