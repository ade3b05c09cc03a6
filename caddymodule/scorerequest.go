package caddymodule

import (
	"net/http"
	"strings"

	"github.com/aovhq/aov/score"
)

// validateScore is the validator of score requests (see Gate.Validator).
const validateScore = "score_request"

// checkScorePath is validate score_request on a REST call: the agent id
// its path names, by verifierd's rule for a score path
// (score.CheckPathAgent), so the gate refuses (422) exactly the paths
// verifierd would not serve and never sells one.
func (g *Gate) checkScorePath(r *http.Request) error {
	return score.CheckPathAgent(g.pathAgent(r))
}

// pathAgent is the agent id a score request names in its path: what
// follows the route's path up to "{agent_id}" ("/score/" without one),
// decoded as verifierd reads it. A path outside that prefix names no
// agent, which the rule refuses. route is the public path, as
// /.well-known/x402 lists it, so it is matched against the path the client
// sent (sentRequest), not what handle_path or a rewrite left of it.
func (g *Gate) pathAgent(r *http.Request) string {
	prefix := "/score/"
	if _, path := splitRoute(g.Route); path != "" {
		if before, _, found := strings.Cut(path, "{agent_id}"); found {
			prefix = before
		}
	}
	_, u := sentRequest(r)
	agent, ok := strings.CutPrefix(u.Path, prefix)
	if !ok {
		return ""
	}
	return agent
}
