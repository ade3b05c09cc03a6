package score

import (
	"errors"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
)

func TestScoreRequestRule(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		args  map[string]any
		field string // "" when accepted
	}{
		{"a name", map[string]any{"agent_id": "seller-7"}, ""},
		{"200 characters", map[string]any{"agent_id": strings.Repeat("é", 200)}, ""},
		{"an account id", map[string]any{"agent_id": "eip155:8453:0xa0Ee7A142d267C1f36714E4a8F75612F20a79720"}, ""},
		{"a test- id", map[string]any{"agent_id": "test-demo"}, "agent_id"},
		{"empty", map[string]any{"agent_id": ""}, "agent_id"},
		{"201 characters", map[string]any{"agent_id": strings.Repeat("a", 201)}, "agent_id"},
		{"invalid UTF-8", map[string]any{"agent_id": "a\xff"}, "agent_id"},
		{"no arguments", nil, "agent_id"},
		{"not a string", map[string]any{"agent_id": 7.0}, "agent_id"},
		{"an extra member", map[string]any{"agent_id": "seller-7", "x": 1.0}, "arguments"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			agent, err := ToolAgent(tc.args)
			if tc.field == "" {
				if err != nil || agent != tc.args["agent_id"] {
					t.Fatalf("refused: %q, %v", agent, err)
				}
				if err := CheckAgent(agent); err != nil {
					t.Fatalf("the path rule refuses what the tool rule accepts: %v", err)
				}
				return
			}
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Status != 422 || ae.Code != apierr.CodeInvalidRequest || ae.Fields[0].Field != tc.field {
				t.Fatalf("got %q, %#v; want a 422 naming %s", agent, err, tc.field)
			}
			if s, ok := tc.args["agent_id"].(string); ok && tc.field == "agent_id" && CheckAgent(s) == nil {
				t.Fatal("the path rule accepts what the tool rule refuses")
			}
		})
	}
}
