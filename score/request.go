package score

import (
	"path"
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

// PathNamesAgent reports whether agent, the decoded rest of a path after
// its prefix (/score/, /reputation/), leaves that path clean: no empty,
// "." or ".." segment and no trailing slash. It is verifierd's router's
// rule: a path that is not clean is no route there (404), since the gateway
// routes by the cleaned path but proxies the path as sent, so
// "/score/x/../../health" would come through a free route. An id such as
// "seller-7/" is a valid agent id (a verification may record it) that no
// path names; the score tool takes it in its arguments. The empty id
// leaves the bare prefix, which is clean: CheckAgent refuses it.
func PathNamesAgent(agent string) bool {
	p := "/" + agent
	return path.Clean(p) == p
}

// CheckPathAgent is the rule for the agent id a score request names in its
// path: one PathNamesAgent accepts, so that verifierd routes the path, then
// CheckAgent's. The gateway applies it before asking for payment, so a
// path verifierd would answer 404 is refused (422), never sold.
func CheckPathAgent(agent string) error {
	if !PathNamesAgent(agent) {
		return apierr.Invalid(apierr.Field{Field: "agent_id",
			Problem: "ends in '/' or has an empty, '.' or '..' segment, so no score path names it",
			Fix:     "Name the agent id without a trailing '/', '//' or a '.' or '..' segment: /score/seller-7; an id that has one is scored by the get_verification_record tool, which takes it in its arguments."})
	}
	return CheckAgent(agent)
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
