package agentcard

import (
	"strings"
	"testing"
)

// certd builds the card without the gateway's configuration, and the
// gateway's free allowance is optional (`per_day 0`, or no free_allowance,
// grants no free calls) and may be set on any route. So the card's
// descriptions must not promise a free allowance, nor that a route is never
// free: the live terms are the gateway's to state (its 402 answers).
func TestCardMakesNoClaimOnTheGatewaysFreeAllowance(t *testing.T) {
	ks, _ := history(t)
	_, m := buildJSON(t, ks)
	texts := map[string]string{"description": m["description"].(string)}
	for _, s := range m["skills"].([]any) {
		s := s.(map[string]any)
		texts["skill "+s["id"].(string)] = s["description"].(string)
	}
	for where, text := range texts {
		for _, claim := range []string{"after a free daily allowance", "never free"} {
			if strings.Contains(text, claim) {
				t.Errorf("the card's %s says %q, which depends on the gateway's config: %s", where, claim, text)
			}
		}
	}
}
