package store

import (
	"errors"
	"fmt"
	"strings"
)

// Prepare checks v and normalises it exactly as RecordVerification does
// before writing (time in UTC, Test set from the agent id, an empty payment
// kind made unknown), so another history backend records the same facts.
func (v *Verification) Prepare() error {
	if err := v.validate(); err != nil {
		return err
	}
	v.VerifiedAt = v.VerifiedAt.UTC()
	v.Test = strings.HasPrefix(v.AgentID, TestAgentPrefix)
	return nil
}

// Add counts v into c as RecordVerification does, for history backends
// that keep counts of their own.
func (c *Counts) Add(v Verification) { c.add(v) }

// ClaimKeys checks the keys of a claim as Claims.Claim does (at least one,
// each 1..MaxClaimKeyBytes bytes) and returns them without repeats, in
// order, in a new slice, so every backend claims the same set.
func ClaimKeys(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, errors.New("store: claim of no keys")
	}
	out := make([]string, 0, len(keys))
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if k == "" || len(k) > MaxClaimKeyBytes {
			return nil, fmt.Errorf("store: claim key must be 1..%d bytes", MaxClaimKeyBytes)
		}
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out, nil
}
