package score

import (
	"strings"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
)

// CheckAgent is the rule for the agent id of a score request, named in the
// path of GET /score/{agent_id} or in the score tool's arguments: 1 to 200
// characters of UTF-8 (verify.ValidID, the rule of the agent_id a
// verification records), and not a test- id (those are examples and never
// get a score). verifierd applies it before computing a score and the
// gateway before asking for payment, so a request that can never be served
// is refused (422), never offered for sale.
func CheckAgent(agent string) error {
	if !verify.ValidID(agent) {
		return apierr.Invalid(apierr.Field{Field: "agent_id", Problem: "must be 1 to 200 characters",
			Fix: "Name the agent_id used in verification requests, URL-encoded in the path: /score/seller-7."})
	}
	if strings.HasPrefix(agent, store.TestAgentPrefix) {
		return apierr.Invalid(apierr.Field{Field: "agent_id",
			Problem: "starts with 'test-', which is reserved for examples that never get a trust score",
			Fix:     "Ask for the score of a real agent id; a test- agent's history is free at /reputation/{agent_id}."})
	}
	return nil
}

// ToolAgent reads the score tool's arguments, {"agent_id": "..."} (a
// string, no other member), and checks the agent id with CheckAgent.
// args is the decoded arguments object; nil is an empty one.
func ToolAgent(args map[string]any) (string, error) {
	var fields []apierr.Field
	agent, isString := args["agent_id"].(string)
	switch _, present := args["agent_id"]; {
	case !present:
		fields = append(fields, apierr.Field{Field: "agent_id", Problem: "is required",
			Fix: "Name the agent_id used in verification requests, 1 to 200 characters."})
	case !isString:
		fields = append(fields, apierr.Field{Field: "agent_id", Problem: "is not a string",
			Fix: "Name the agent_id used in verification requests, 1 to 200 characters."})
	}
	for k := range args {
		if k != "agent_id" {
			fields = append(fields, apierr.Field{Field: "arguments", Problem: "has a member other than agent_id",
				Fix: "Remove it; get_verification_record takes only agent_id."})
			break
		}
	}
	if len(fields) > 0 {
		return "", apierr.Invalid(fields...)
	}
	if err := CheckAgent(agent); err != nil {
		return "", err
	}
	return agent, nil
}
