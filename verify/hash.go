package verify

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"math"
	"sync"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/strictjson"
)

// The four hashes (SPEC §5) are computed from the decoded request tree,
// never from the raw body, so that whitespace, key order and number
// spelling do not change them. submitted_output and expected_schema are
// canonicalized once each; the request's canonical form is streamed into
// its hasher from those pieces (its eight keys in sorted order), so the
// largest parts are never canonicalized twice.

// bufPool recycles the canonical-form buffer.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// hashState computes the hashes of one request.
type hashState struct {
	hashes receipt.Hashes
}

func sum(h hash.Hash) string {
	var out [sha256.Size]byte
	return hex.EncodeToString(h.Sum(out[:0]))
}

// compute fills h.hashes from the decoded request doc (already known to be
// an object with expected_schema and submitted_output).
func (h *hashState) compute(doc map[string]any) error {
	bp := bufPool.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 1<<20 { // do not pin huge buffers
			bufPool.Put(bp)
		}
	}()
	buf := (*bp)[:0]
	var err error

	if buf, err = receipt.AppendCanonical(buf, doc["submitted_output"]); err != nil {
		return err
	}
	outEnd := len(buf)
	if buf, err = receipt.AppendCanonical(buf, doc["expected_schema"]); err != nil {
		return err
	}
	schemaEnd := len(buf)

	// rules_hash: bounds and rules exactly as sent (absent → null).
	buf = append(buf, `{"bounds":`...)
	if buf, err = receipt.AppendCanonical(buf, doc["bounds"]); err != nil {
		return err
	}
	buf = append(buf, `,"rules":`...)
	if buf, err = receipt.AppendCanonical(buf, doc["rules"]); err != nil {
		return err
	}
	buf = append(buf, '}')
	rulesEnd := len(buf)

	output, schemaC, rulesC := buf[:outEnd], buf[outEnd:schemaEnd], buf[schemaEnd:rulesEnd]
	h.hashes.Output = receipt.Hash(output)
	h.hashes.Schema = receipt.Hash(schemaC)
	h.hashes.Rules = receipt.Hash(rulesC)

	// request_hash: the eight fields, defaults filled in, keys sorted:
	// agent_id, bounds, enforce_rules, expected_schema, rules,
	// strict_content_check, submitted_output, task_id.
	rest := buf[rulesEnd:]
	rest = append(rest, `{"agent_id":`...)
	if rest, err = receipt.AppendCanonical(rest, doc["agent_id"]); err != nil {
		return err
	}
	rest = append(rest, `,"bounds":`...)
	if rest, err = receipt.AppendCanonical(rest, normalBounds(doc["bounds"])); err != nil {
		return err
	}
	rest = append(rest, `,"enforce_rules":`...)
	rest = appendBool(rest, doc["enforce_rules"])
	rest = append(rest, `,"expected_schema":`...)
	mid := len(rest)
	rest = append(rest, `,"rules":`...)
	if rest, err = receipt.AppendCanonical(rest, normalRules(doc["rules"])); err != nil {
		return err
	}
	rest = append(rest, `,"strict_content_check":`...)
	rest = appendBool(rest, doc["strict_content_check"])
	rest = append(rest, `,"submitted_output":`...)
	tail := len(rest)
	rest = append(rest, `,"task_id":`...)
	if rest, err = receipt.AppendCanonical(rest, doc["task_id"]); err != nil {
		return err
	}
	rest = append(rest, '}')

	rh := sha256.New()
	rh.Write(rest[:mid])
	rh.Write(schemaC)
	rh.Write(rest[mid:tail])
	rh.Write(output)
	rh.Write(rest[tail:])
	h.hashes.Request = sum(rh)

	*bp = buf[:0]
	if cap(rest) > cap(buf) {
		*bp = rest[:0]
	}
	return nil
}

// requestCanonical returns the canonical request document of SPEC §5 in one
// piece: what request_hash is the SHA-256 of. Tests and the agent card's
// test vectors use it; Parse streams the same bytes into the hasher.
func requestCanonical(doc map[string]any) ([]byte, error) {
	fields := map[string]any{
		"agent_id":             doc["agent_id"],
		"bounds":               normalBounds(doc["bounds"]),
		"enforce_rules":        doc["enforce_rules"] == true,
		"expected_schema":      doc["expected_schema"],
		"rules":                normalRules(doc["rules"]),
		"strict_content_check": doc["strict_content_check"] == true,
		"submitted_output":     doc["submitted_output"],
		"task_id":              doc["task_id"],
	}
	return receipt.AppendCanonical(nil, fields)
}

func appendBool(dst []byte, v any) []byte {
	if v == true {
		return append(dst, "true"...)
	}
	return append(dst, "false"...)
}

// normalBounds fills every bound's defaults: min and max null and
// if_present false unless given. Absent or empty bounds are null.
func normalBounds(raw any) any {
	m, ok := raw.(map[string]any)
	if !ok || len(m) == 0 {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		e, ok := v.(map[string]any)
		if !ok {
			out[k] = v
			continue
		}
		n := map[string]any{"min": e["min"], "max": e["max"], "if_present": false}
		if ip, ok := e["if_present"]; ok && ip != nil {
			n["if_present"] = ip
		}
		out[k] = n
	}
	return out
}

// normalRules gives every rule every rule field: operands null, tolerance
// 1e-9 and if_present false unless given. Absent or empty rules are null.
func normalRules(raw any) any {
	list, ok := raw.([]any)
	if !ok || len(list) == 0 {
		return nil
	}
	out := make([]any, len(list))
	for i, v := range list {
		r, ok := v.(map[string]any)
		if !ok {
			out[i] = v
			continue
		}
		n := make(map[string]any, len(ruleFields))
		for _, f := range ruleFields {
			n[f] = r[f]
		}
		if n["tolerance"] == nil {
			n["tolerance"] = defaultToleranceText
		}
		if n["if_present"] == nil {
			n["if_present"] = false
		}
		out[i] = n
	}
	return out
}

// hashMaxDepth is deliberately generous: ComputeHashes recomputes the hashes
// of a request a service already accepted, possibly under larger limits
// than this process's defaults.
const hashMaxDepth = 10000

// ComputeHashes recomputes the four hashes of SPEC §5 from a request body a
// holder kept. The body must be a request the service would accept, apart
// from size and count limits and the integrity-work budget; the schema is
// not compiled.
func ComputeHashes(body []byte) (receipt.Hashes, error) {
	want, err := ComputeExpected(body)
	return want.Hashes, err
}

// ComputeExpected is what a verification receipt of the request body a
// holder kept must state (receipt.CheckRequest; the aov command-line
// tool's offline receipt check): the four hashes of ComputeHashes and the
// request members a receipt carries.
func ComputeExpected(body []byte) (receipt.Expected, error) {
	v := New(Config{MaxBodyBytes: math.MaxInt64, MaxDepth: hashMaxDepth, MaxRules: math.MaxInt32, MaxBounds: math.MaxInt32,
		MaxIntegrityWork: math.MaxInt64})
	tree, err := strictjson.Decode(body, strictjson.Limits{MaxDepth: hashMaxDepth})
	if err != nil {
		return receipt.Expected{}, err
	}
	doc, ok := tree.(map[string]any)
	if !ok {
		return receipt.Expected{}, errors.New("the request is not a JSON object")
	}
	req, err := v.parseDoc(doc, false)
	if err != nil {
		var ae *apierr.Error
		if errors.As(err, &ae) && len(ae.Fields) > 0 {
			return receipt.Expected{}, errors.New("the request is invalid: " + ae.Fields[0].Field + " " + ae.Fields[0].Problem)
		}
		return receipt.Expected{}, err
	}
	return receipt.Expected{
		Hashes:             req.Hashes,
		TaskID:             req.TaskID,
		AgentID:            req.AgentID,
		StrictContentCheck: req.StrictContentCheck,
		EnforceRules:       req.EnforceRules,
	}, nil
}
