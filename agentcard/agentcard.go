// Package agentcard builds the service's agent card
// (/.well-known/agent-card.json): an A2A-style description of the service,
// its two skills, and the attestation extension that publishes every public
// key the service ever signed with, so anyone can verify a receipt offline
// with nothing but the response and this card.
//
// It is for certd, which holds the key history. It is not a general A2A
// library and does not fetch or verify cards (package receipt parses them).
package agentcard

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
)

// Config is what an operator says about the service in its card.
type Config struct {
	// Name is the service name, also the "service" of every verify block.
	Name string
	// Description says what the service does, for agents that discover it.
	Description string
	// BaseURL is the public base URL of the service, e.g.
	// https://verify.example.com (no trailing slash needed).
	BaseURL string
	// Version is the service's version string.
	Version string
	// Provider names who runs the service; nil leaves it out.
	Provider *Provider
}

// Provider is the organisation behind the service.
type Provider struct {
	Organization string `json:"organization"`
	URL          string `json:"url,omitempty"`
}

// Defaults for an unconfigured card. Like the skills, they say nothing the
// gateway's configuration decides (a free allowance is optional and may be
// set on any route; certd never sees that config): a 402 states the terms.
const (
	DefaultName        = "Agent Output Verifier"
	DefaultDescription = "Deterministic verification of agent outputs against a JSON Schema and cross-field rules, with Ed25519-signed receipts over RFC 8785 canonical JSON. Paid per call with x402 v2; a 402 answer states the live price and any free allowance."
)

// Card is the agent card document. Field order is the JSON order.
type Card struct {
	Name               string       `json:"name"`
	Description        string       `json:"description"`
	URL                string       `json:"url"`
	Version            string       `json:"version"`
	DocumentationURL   string       `json:"documentationUrl,omitempty"`
	Provider           *Provider    `json:"provider,omitempty"`
	Capabilities       Capabilities `json:"capabilities"`
	DefaultInputModes  []string     `json:"defaultInputModes"`
	DefaultOutputModes []string     `json:"defaultOutputModes"`
	Skills             []Skill      `json:"skills"`
}

// Capabilities lists what the service supports beyond plain calls.
type Capabilities struct {
	Streaming         bool        `json:"streaming"`
	PushNotifications bool        `json:"pushNotifications"`
	Extensions        []Extension `json:"extensions"`
}

// Extension is an A2A agent extension entry.
type Extension struct {
	URI         string          `json:"uri"`
	Description string          `json:"description"`
	Required    bool            `json:"required"`
	Params      AttestationInfo `json:"params"`
}

// AttestationInfo is the attestation extension's params: everything a
// verifier needs to check a receipt.
type AttestationInfo struct {
	PublicKeys             []receipt.PublicKey `json:"publicKeys"`
	CurrentKeyVersion      string              `json:"currentKeyVersion"`
	Canonicalization       string              `json:"canonicalization"`
	HashAlgorithm          string              `json:"hashAlgorithm"`
	Contexts               Contexts            `json:"contexts"`
	SignedDocument         string              `json:"signedDocument"`
	RequestHashTestVectors []TestVector        `json:"requestHashTestVectors"`
}

// Contexts names the signing context of each kind of receipt.
type Contexts struct {
	Verify string `json:"verify"`
	Score  string `json:"score"`
}

// TestVector lets an implementer check their request_hash: a request as
// sent, its canonical defaults-filled form, and the hash of that form.
type TestVector struct {
	Request     json.RawMessage `json:"request"`
	Canonical   string          `json:"canonical"`
	RequestHash string          `json:"request_hash"`
}

// Skill is one capability an agent can call.
type Skill struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Tags        []string `json:"tags"`
	Examples    []string `json:"examples"`
	InputModes  []string `json:"inputModes"`
	OutputModes []string `json:"outputModes"`
}

// SignedDocument describes what an attestation signs.
const SignedDocument = `{context, algorithm, key_version, attested_at, response}: Ed25519 over the RFC 8785 bytes of this five-key object, where response is the whole response without its "attestation" member`

var jsonModes = []string{"application/json"}

// Build returns the card for cfg and the key history keys (every version
// ever used, oldest first, as keystore.Store.List gives it) as it stands
// now by the history alone (keystore.Statuses: Build cannot know whether
// a signer can sign with the key in service; Handler asks its store). It fails when there is no key at all. A history
// with no key in service (a compromise of the current key whose
// replacement could not be created yet, keystore.ReplacementRefusedError,
// or a replacement dated by a clock ahead) signs nothing, and the card
// must still publish the mark, so currentKeyVersion is empty.
func Build(cfg Config, keys []keystore.Key) (*Card, error) {
	pubs, err := published(keys, keystore.Statuses(keys, time.Now()))
	if err != nil {
		return nil, err
	}
	return build(cfg, pubs)
}

// published is what the card says of each key, oldest first, with its
// status (keystore.Statuses): everything it prints of the key history, so
// the handler rebuilds the card exactly when this changes.
func published(keys []keystore.Key, statuses []string) ([]receipt.PublicKey, error) {
	pubs := make([]receipt.PublicKey, 0, len(keys))
	for i, k := range keys {
		if len(k.Public) == 0 {
			return nil, fmt.Errorf("building agent card: key %s has no public key", k.Version)
		}
		// A card with a key under which anyone can forge signatures
		// (a tampered key index) is never published: verifiers refuse it
		// whole, every receipt of the service with it.
		if err := receipt.CheckPublicKey(k.Public); err != nil {
			return nil, fmt.Errorf("building agent card: key %s: %w", k.Version, err)
		}
		pubs = append(pubs, receipt.PublicKey{
			KeyVersion:        k.Version,
			Algorithm:         receipt.Algorithm,
			PublicKey:         base64.StdEncoding.EncodeToString(k.Public),
			PublicKeyEncoding: "base64",
			Status:            statuses[i],
			CreatedAt:         formatTime(k.CreatedAt),
			RetiredAt:         formatTime(k.RetiredAt),
			CompromisedSince:  formatTime(k.CompromisedSince),
		})
	}
	return pubs, nil
}

// build is Build from the published key entries.
func build(cfg Config, pubs []receipt.PublicKey) (*Card, error) {
	base := strings.TrimRight(cfg.BaseURL, "/")
	if base == "" {
		return nil, errors.New("building agent card: no public base URL")
	}
	name := cfg.Name
	if name == "" {
		name = DefaultName
	}
	desc := cfg.Description
	if desc == "" {
		desc = DefaultDescription
	}
	current := ""
	for _, p := range pubs {
		if p.Status == keystore.StatusCurrent {
			current = p.KeyVersion
		}
	}
	if len(pubs) == 0 {
		return nil, errors.New("building agent card: no signing key")
	}
	vectors, err := TestVectors()
	if err != nil {
		return nil, fmt.Errorf("building agent card: %w", err)
	}
	return &Card{
		Name:             name,
		Description:      desc,
		URL:              base,
		Version:          cfg.Version,
		DocumentationURL: base + "/docs",
		Provider:         cfg.Provider,
		Capabilities: Capabilities{Extensions: []Extension{{
			URI:         receipt.ExtensionURI,
			Description: "Signed receipts: every /verify/* and /score/* response carries an Ed25519 attestation over RFC 8785 canonical JSON. Pick the publicKeys entry whose keyVersion equals attestation.key_version, rebuild the signed document, canonicalize and verify. Every key version ever used is listed, so old receipts stay verifiable after rotation; reject receipts of a compromised key dated at or after its compromisedSince.",
			Required:    false,
			Params: AttestationInfo{
				PublicKeys:             pubs,
				CurrentKeyVersion:      current,
				Canonicalization:       receipt.Canonicalization,
				HashAlgorithm:          receipt.HashAlgorithm,
				Contexts:               Contexts{Verify: receipt.ContextVerify, Score: receipt.ContextScore},
				SignedDocument:         SignedDocument,
				RequestHashTestVectors: vectors,
			},
		}}},
		DefaultInputModes:  jsonModes,
		DefaultOutputModes: jsonModes,
		Skills:             skills(base),
	}, nil
}

// Marshal encodes the card as the bytes certd serves: compact, and without
// HTML escaping, so each test vector's request reads byte for byte as the
// SPEC prints it (10.0 and 1e-06 included).
func (c *Card) Marshal() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("encoding agent card: %w", err)
	}
	return b.Bytes(), nil
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func skills(base string) []Skill {
	return []Skill{
		{
			ID:   "verify_schema",
			Name: "Verify an output against a JSON Schema and rules",
			Description: "Checks a JSON output against a JSON Schema (structure, formats, ranges) and cross-field rules (sum_equals, gte, lte, exists_in, unique) and numeric bounds. " +
				"Answers pass/fail, the share of checks passed, repair hints, and an Ed25519-signed receipt. REST: POST " + base + "/verify/schema (or /verify/deliverable); MCP tool verify_schema at " + base + "/mcp. " +
				"Paid per call with x402 v2; a 402 answer states the live price and any free daily allowance per client.",
			Tags: []string{"verification", "json-schema", "validation", "receipts", "ed25519", "x402"},
			Examples: []string{
				`{"task_id":"invoice-42","expected_schema":{"type":"object","required":["total"],"properties":{"total":{"type":"number"}}},"submitted_output":{"total":129.5}}`,
				"Check that this invoice's line totals sum to its total before I pay the seller.",
			},
			InputModes:  jsonModes,
			OutputModes: jsonModes,
		},
		{
			ID:   "get_verification_record",
			Name: "Get an agent's trust score",
			Description: "A signed trust score computed from an agent's verification history (rewards sustained passing, discounts old and few data points). " +
				"REST: GET " + base + "/score/{agent_id} (paid per call with x402 v2); the free pass/fail history is GET " + base + "/reputation/{agent_id}. MCP tool get_verification_record at " + base + "/mcp.",
			Tags:        []string{"reputation", "trust-score", "receipts", "x402"},
			Examples:    []string{`{"agent_id":"seller-7"}`, "How reliable has agent seller-7 been at producing valid invoices?"},
			InputModes:  jsonModes,
			OutputModes: jsonModes,
		},
	}
}
