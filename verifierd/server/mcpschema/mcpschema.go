// Package mcpschema holds the input schemas of verifierd's MCP tools: the
// JSON files in this folder, written by hand (SPEC §3), are the one copy
// that verifierd's tools/list and the gateway's bazaar extension for a
// priced tool both read.
package mcpschema

import (
	"bytes"
	_ "embed"
)

var (
	//go:embed verify_schema.input.json
	verifySchema []byte
	//go:embed get_verification_record.input.json
	getVerificationRecord []byte
)

// VerifySchema is the input schema of the verify_schema tool: the body of
// POST /verify/schema.
func VerifySchema() []byte { return bytes.Clone(verifySchema) }

// GetVerificationRecord is the input schema of the get_verification_record
// tool: the agent whose trust score to compute.
func GetVerificationRecord() []byte { return bytes.Clone(getVerificationRecord) }
