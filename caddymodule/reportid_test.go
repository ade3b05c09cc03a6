package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"
)

// answerVerificationIDReference is the reading answerVerificationID must
// agree with: encoding/json into maps of raw members (exact names, the last
// of duplicates), verification_id at the top when it is a non-empty
// string, else the one in result.structuredContent.
func answerVerificationIDReference(body []byte) string {
	str := func(raw json.RawMessage) string {
		var s string
		if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			return ""
		}
		return s
	}
	var top, res, doc map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return ""
	}
	if id := str(top["verification_id"]); id != "" {
		return id
	}
	if json.Unmarshal(top["result"], &res) != nil || json.Unmarshal(res["structuredContent"], &doc) != nil {
		return ""
	}
	return str(doc["verification_id"])
}

// restAnswer is verifierd's REST answer to the SPEC §10 invoice: the
// signed document the MCP answer carries as structuredContent.
var restAnswer = func() []byte {
	var a struct {
		Result struct {
			Doc json.RawMessage `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.Unmarshal(mcpBenchAnswer, &a); err != nil || len(a.Result.Doc) == 0 {
		panic("testdata/mcp_verify_schema_answer.json has no structuredContent")
	}
	return a.Result.Doc
}()

var verificationIDCases = []struct{ answer, id string }{
	{string(restAnswer), answerVerificationIDReference(restAnswer)},
	{string(mcpBenchAnswer), answerVerificationIDReference(mcpBenchAnswer)},
	{`{"verification_id":"v-1","result":"pass"}`, "v-1"},
	{` { "verification_id" : "v-1" } `, "v-1"},
	{`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"verification_id":"v-2"}}}`, "v-2"},
	// Exact names, the last of duplicates: a case twin names nothing.
	{`{"Verification_ID":"v-1"}`, ""},
	{`{"verification_id":"v-1","verification_id":"v-2"}`, "v-2"},
	{`{"verification\u005fid":"v-3"}`, "v-3"},
	{`{"result":{"StructuredContent":{"verification_id":"v-1"}}}`, ""},
	{`{"result":{"structuredContent":{"verification_id":"v-1"}},"result":{}}`, ""},
	// Escapes and bytes in the id read as encoding/json reads them.
	{`{"verification_id":"v-\u0031\n"}`, "v-1\n"},
	{"{\"verification_id\":\"v-\xff\"}", "v-\uFFFD"},
	// The top's id first, when it is a non-empty string.
	{`{"verification_id":"v-1","result":{"structuredContent":{"verification_id":"v-2"}}}`, "v-1"},
	{`{"verification_id":"","result":{"structuredContent":{"verification_id":"v-2"}}}`, "v-2"},
	{`{"verification_id":7,"result":{"structuredContent":{"verification_id":"v-2"}}}`, "v-2"},
	{`{"verification_id":null}`, ""},
	{`{"verification_id":["v-1"]}`, ""},
	// Only those two places: not deeper, not in arrays.
	{`{"x":{"verification_id":"v-1"}}`, ""},
	{`{"result":{"x":{"verification_id":"v-1"}}}`, ""},
	{`{"result":[{"structuredContent":{"verification_id":"v-1"}}]}`, ""},
	{`{"result":{"structuredContent":"{\"verification_id\":\"v-1\"}"}}`, ""},
	{`{"s":"\"verification_id\":\"v-1\"","verification_id":"v-4"}`, "v-4"},
	// Not JSON, anywhere in the answer: nothing.
	{`{"verification_id":"v-1"} x`, ""},
	{`{"verification_id":"v-1",}`, ""},
	{`{"verification_id":"v-1","n":01}`, ""},
	{"{\"verification_id\":\"v-\x01\"}", ""},
	{`{"verification_id":"v-1"`, ""},
	{`[{"verification_id":"v-1"}]`, ""},
	{`"v-1"`, ""},
	{`null`, ""},
	{``, ""},
	{`{"verification_id":"v-1","x":` + strings.Repeat("[", maxAnswerDepth) + strings.Repeat("]", maxAnswerDepth) + `}`, ""},
	{`{"verification_id":"v-1","x":` + strings.Repeat("[", maxAnswerDepth-1) + strings.Repeat("]", maxAnswerDepth-1) + `}`, "v-1"},
}

func TestAnswerVerificationIDReadsExactNames(t *testing.T) {
	if verificationIDCases[0].id == "" || verificationIDCases[1].id == "" {
		t.Fatal("the test answers name no verification")
	}
	for _, c := range verificationIDCases {
		if got := answerVerificationID([]byte(c.answer)); got != c.id {
			t.Errorf("%.80q: %q, want %q", c.answer, got, c.id)
		}
		if ref := answerVerificationIDReference([]byte(c.answer)); ref != c.id {
			t.Errorf("%.80q: the reference reads %q; the case is wrong", c.answer, ref)
		}
	}
}

// FuzzAnswerVerificationID: the gate's walk and encoding/json's maps of raw
// members read the same verification from every answer.
func FuzzAnswerVerificationID(f *testing.F) {
	for _, c := range verificationIDCases {
		f.Add([]byte(c.answer))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		if got, want := answerVerificationID(answer), answerVerificationIDReference(answer); got != want {
			t.Fatalf("%q: %q; encoding/json reads %q", answer, got, want)
		}
	})
}

// BenchmarkAnswerVerificationID is the reading of verifierd's signed answer
// that every paid call makes to report its outcome: "struct" encoding/json
// into a struct (the reading before the walk), "members" the reference,
// "walk" answerVerificationID; for the REST answer and the MCP one.
func BenchmarkAnswerVerificationID(b *testing.B) {
	byStruct := func(body []byte) string {
		var doc struct {
			ID     string          `json:"verification_id"`
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal(body, &doc) != nil {
			return ""
		}
		if doc.ID == "" && len(doc.Result) > 0 && doc.Result[0] == '{' {
			var res struct {
				Doc struct {
					ID string `json:"verification_id"`
				} `json:"structuredContent"`
			}
			if json.Unmarshal(doc.Result, &res) == nil {
				doc.ID = res.Doc.ID
			}
		}
		return doc.ID
	}
	for _, a := range []struct {
		name   string
		answer []byte
	}{{"rest", restAnswer}, {"mcp", mcpBenchAnswer}} {
		for _, c := range []struct {
			name string
			read func([]byte) string
		}{{"struct", byStruct}, {"members", answerVerificationIDReference}, {"walk", answerVerificationID}} {
			b.Run(a.name+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(a.answer)))
				for b.Loop() {
					if c.read(a.answer) == "" {
						b.Fatal("no verification_id")
					}
				}
			})
		}
	}
}
