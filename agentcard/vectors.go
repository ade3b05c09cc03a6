package agentcard

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/verify"
)

// vectorRequests are the three request_hash test vectors of the contract:
// requests exactly as a caller sends them (10.0, 1e+21 and 1e-06 spelled as
// sent, so the card shows what canonicalization must do to them).
var vectorRequests = []string{
	`{"task_id":"tv-1","expected_schema":{"type":"object","required":["ok"],"properties":{"ok":{"type":"boolean"}}},"submitted_output":{"ok":true}}`,
	`{"task_id":"tv-2","agent_id":"seller-7","expected_schema":{"type":"object","required":["items","total"],"properties":{"items":{"type":"array","items":{"type":"object","required":["id","price"],"properties":{"id":{"type":"string"},"price":{"type":"number"}}}},"total":{"type":"number"}}},"submitted_output":{"total":30.5,"items":[{"id":"a","price":10.0},{"id":"b","price":20.5}]},"bounds":{"items[].price":{"min":0,"max":100}},"rules":[{"type":"sum_equals","field":"items[].price","equals_field":"total","tolerance":0.01},{"type":"unique","field":"items[].id"}],"enforce_rules":true}`,
	`{"task_id":"tv-3","expected_schema":{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"number"}}},"submitted_output":{"n":1.0,"name":"café ✓","z":[1e+21,1e-06]},"strict_content_check":true,"rules":[{"type":"gte","field":"n","value":0,"if_present":true}]}`,
}

// vectorCanonical are the canonical, defaults-filled forms of vectorRequests
// (SPEC §5). TestVectors checks each against the hash the verifier computes
// from the request, so the card can never publish a form the service does
// not actually hash.
var vectorCanonical = []string{
	`{"agent_id":null,"bounds":null,"enforce_rules":false,"expected_schema":{"properties":{"ok":{"type":"boolean"}},"required":["ok"],"type":"object"},"rules":null,"strict_content_check":false,"submitted_output":{"ok":true},"task_id":"tv-1"}`,
	`{"agent_id":"seller-7","bounds":{"items[].price":{"if_present":false,"max":100,"min":0}},"enforce_rules":true,"expected_schema":{"properties":{"items":{"items":{"properties":{"id":{"type":"string"},"price":{"type":"number"}},"required":["id","price"],"type":"object"},"type":"array"},"total":{"type":"number"}},"required":["items","total"],"type":"object"},"rules":[{"equals":null,"equals_field":"total","field":"items[].price","if_present":false,"in_field":null,"other_field":null,"tolerance":0.01,"type":"sum_equals","value":null,"values":null},{"equals":null,"equals_field":null,"field":"items[].id","if_present":false,"in_field":null,"other_field":null,"tolerance":1e-9,"type":"unique","value":null,"values":null}],"strict_content_check":false,"submitted_output":{"items":[{"id":"a","price":10},{"id":"b","price":20.5}],"total":30.5},"task_id":"tv-2"}`,
	`{"agent_id":null,"bounds":null,"enforce_rules":false,"expected_schema":{"properties":{"n":{"type":"number"},"name":{"type":"string"}},"type":"object"},"rules":[{"equals":null,"equals_field":null,"field":"n","if_present":true,"in_field":null,"other_field":null,"tolerance":1e-9,"type":"gte","value":0,"values":null}],"strict_content_check":true,"submitted_output":{"n":1,"name":"café ✓","z":[1e+21,0.000001]},"task_id":"tv-3"}`,
}

// TestVectors returns the request_hash test vectors the card publishes. The
// hash is computed from the request by the verifier's own code
// (verify.ComputeHashes), and must equal the hash of the published canonical
// form: the card can only publish vectors the service reproduces.
func TestVectors() ([]TestVector, error) {
	out := make([]TestVector, len(vectorRequests))
	for i, req := range vectorRequests {
		hashes, err := verify.ComputeHashes([]byte(req))
		if err != nil {
			return nil, fmt.Errorf("request hash test vector %d: %w", i+1, err)
		}
		canon := []byte(vectorCanonical[i])
		again, err := receipt.Canonicalize(canon)
		if err != nil || !bytes.Equal(again, canon) {
			return nil, fmt.Errorf("request hash test vector %d: the canonical form is not RFC 8785 canonical", i+1)
		}
		if got := receipt.Hash(canon); got != hashes.Request {
			return nil, fmt.Errorf("request hash test vector %d: the verifier hashes the request to %s but the canonical form to %s", i+1, hashes.Request, got)
		}
		out[i] = TestVector{
			Request:     json.RawMessage(req),
			Canonical:   vectorCanonical[i],
			RequestHash: hashes.Request,
		}
	}
	return out, nil
}
