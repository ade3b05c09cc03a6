package store

import "strings"

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
