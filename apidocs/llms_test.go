package apidocs

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/x402"
)

func TestLLMsTxtFollowsTheConventions(t *testing.T) {
	txt := string(LLMsTxt(testService()))
	lines := strings.Split(txt, "\n")
	if lines[0] != "# Agent Output Verifier" {
		t.Errorf("first line %q, want the H1 title", lines[0])
	}
	if lines[1] != "" || !strings.HasPrefix(lines[2], "> ") {
		t.Errorf("the title is not followed by a blockquote summary: %q", lines[1:3])
	}
	for i, l := range lines {
		if strings.HasPrefix(l, "# ") && i > 0 {
			t.Errorf("line %d is a second H1: %q", i+1, l)
		}
	}
	for _, h := range []string{"## Routes and prices", "## Free allowance", "## How to pay (x402 v2)", "## Rate limits", "## Errors", "## Payment errors", "## Trust score", "## Verifying a receipt (offline)", "## MCP", "## Docs"} {
		if !strings.Contains(txt, "\n"+h+"\n") {
			t.Errorf("no section %q", h)
		}
	}
}

func TestLLMsTxtSaysWhatTheConfigurationSays(t *testing.T) {
	txt := string(LLMsTxt(testService()))
	cases := []struct{ desc, want string }{
		{"the verify route has its live price", "| `POST /verify/schema` | $0.02 USDC (`20000` atomic units of `" + baseUSDC + "` on `eip155:8453`, pay to `" + payToAddr + "`); 5 free calls per client per day |"},
		{"the score is priced and never free, whatever its gate says", "| `GET /score/{agent_id}` | $0.01 USDC (`10000` atomic units of `" + baseUSDC + "` on `eip155:8453`, pay to `" + payToAddr + "`); never free |"},
		{"an unpriced contract route says so", "| `POST /verify/deliverable` | not priced on this server |"},
		{"reputation is free", "| `GET /reputation/{agent_id}` | free |"},
		{"a seller's own route is listed with its price", "| `GET /reports/{report_id}` | $1.50 USDC"},
		{"the free allowance names its pool, number and sharers", "- Pool `verify`: **5 free calls per client per UTC day**, shared by `POST /verify/schema` and `POST /mcp` (MCP tool `verify_schema`)."},
		{"the free allowance names the client key", "- Client: its IP address"},
		{"the free allowance names the free body limit", "Largest request body served free: 65536 bytes"},
		{"the free allowance says when it resets", "Resets at the next UTC midnight (00:00 UTC)."},
		{"the free answers' headers are named", "`Free-Allowance-Remaining`, `Free-Allowance-Limit` and `Free-Allowance-Resets`"},
		{"the payment headers are named", "`PAYMENT-REQUIRED`"},
		{"the payment header", "`PAYMENT-SIGNATURE`"},
		{"the settlement header", "`PAYMENT-RESPONSE`"},
		{"the verify context", receipt.ContextVerify},
		{"the score context", receipt.ContextScore},
		{"the key lookup", receipt.ExtensionURIPrefix},
		{"the score method is the score package's, with its parameters", "Method `time-decayed-wilson-lower-bound` version 3. "},
		{"the score method counts only an owner's evidence", "Of an agent_id with an owner (its address for an account id, else the first wallet that bound it with X-Wallet-Auth) only the verifications its owner authenticated are evidence"},
		{"the score method's window and weights", "The newest 10000 pieces of evidence no older than 365 days count, among at most the newest 20000 records of the id read for one score, evidence or not (a paid call whose settlement is pending or failed is never evidence; where such calls outnumber the window, `inputs.window.truncated` is true). Each weighs 2^(−age / 30 days), times 0.5 when it is a bare label."},
		{"the score method names its confidence level", "at z = 1.96"},
		{"the score method's examples are computed by the method", "3 authenticated passes out of 3 today score 0.44, 300 out of 300 score 0.99."},
		{"the MCP endpoint defaults under the base URL", "- Endpoint: `https://verify.example.com/mcp` (Streamable HTTP)."},
		{"the MCP tools", "`get_verification_record`"},
		{"the MCP endpoint's row points at its tools' rows", "| `POST /mcp` | per tool, as the rows below |"},
		{"an MCP tool has its own gate's price, not its REST twin's", "| `POST /mcp` (MCP tool `verify_schema`) | $0.05 USDC (`50000` atomic units of `" + baseUSDC + "` on `eip155:8453`, pay to `" + payToAddr + "`); 5 free calls per client per day | paid MCP tool |"},
		{"the MCP section states each tool's price", "- `verify_schema`: the same input and output as `POST /verify/schema`. Price: $0.05 USDC (`50000`"},
		{"the MCP section states a tool without a gate is not priced", "- `get_verification_record`: the same input and output as `GET /score/{agent_id}`. Price: not priced on this server."},
		{"absolute links use the base URL", "[OpenAPI 3.1](https://verify.example.com/openapi.json)"},
		{"the free routes and MCP are rate limited", "The free routes (`GET /reputation/{agent_id}`, `GET /health`, `GET /.well-known/agent-card.json`, `GET /.well-known/x402`, `GET /llms.txt`, `GET /openapi.json`, `GET /docs`) and every MCP message that is not a priced tool call are rate limited per client"},
		{"the 429 names its code and headers", "HTTP 429 `rate_limited` in the error shape below, with `retry_after` and the `Retry-After` header"},
		{"the priced routes have a limit of their own", "A priced route counts its refused and unpaid answers (402, 4xx) per client instead"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			if !strings.Contains(txt, tc.want) {
				t.Fatalf("llms.txt lacks %q", tc.want)
			}
		})
	}
}

func TestLLMsTxtListsEveryErrorCode(t *testing.T) {
	txt := string(LLMsTxt(testService()))
	codes := []string{
		apierr.CodeInvalidRequest, apierr.CodePayloadTooLarge, apierr.CodeURITooLong, apierr.CodeNotFound, apierr.CodeMethodNotAllowed,
		apierr.CodeUnsupportedMediaType, apierr.CodeUnauthorized, apierr.CodeRateLimited,
		apierr.CodeUpstreamUnavailable, apierr.CodeInternal,
		"free_trial_exhausted", x402.ReasonPaymentAlreadyUsed, "payment_in_flight", x402.ReasonSettlementPending,
		x402.ReasonInvalidPayload, x402.ReasonInsufficientFunds,
	}
	for _, c := range codes {
		if !strings.Contains(txt, "| `"+c+"` |") {
			t.Errorf("the error tables lack %s", c)
		}
	}
	for _, e := range ErrorCodes {
		if e.Status < 400 || e.Meaning == "" {
			t.Errorf("%s: status %d, meaning %q", e.Code, e.Status, e.Meaning)
		}
	}
}

func TestLLMsTxtFollowsOtherConfigurations(t *testing.T) {
	cases := []struct {
		desc    string
		mutate  func(*Service)
		want    []string
		notWant []string
	}{
		{"a new price and allowance after a reload", func(s *Service) {
			s.Routes[0].Accepts = []x402.PaymentRequirements{offer("50000")}
			s.Routes[0].Free.PerDay = 12
		}, []string{"$0.05 USDC (`50000`", "**12 free calls per client per UTC day**"}, []string{"$0.02 USDC"}},
		{"no free allowance at all", func(s *Service) {
			for i := range s.Routes {
				s.Routes[i].Free = nil
			}
		}, []string{"No free allowance is configured"}, []string{"free calls per client per UTC day"}},
		{"a per-wallet allowance", func(s *Service) { s.Routes[0].Free.Key = "wallet" }, []string{"- Client: the wallet proven with the `X-Wallet-Auth` header"}, nil},
		{"an explicit MCP URL", func(s *Service) { s.MCPURL = "https://mcp.example.net/v1" }, []string{"- Endpoint: `https://mcp.example.net/v1`"}, nil},
		{"a published score method", func(s *Service) {
			s.ScoreMethod = "Score = Wilson lower bound of the pass ratio, halved every 30 days."
		},
			[]string{"## Trust score\n", "\nScore = Wilson lower bound of the pass ratio, halved every 30 days.\n"}, []string{"time-decayed-wilson-lower-bound"}},
		{"two ways to pay", func(s *Service) {
			sep := offer("20000")
			sep.Network, sep.Asset = x402.NetworkBaseSepolia, "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
			s.Routes[0].Accepts = append(s.Routes[0].Accepts, sep)
		}, []string{"on `eip155:8453`, pay to", " or $0.02 USDC (`20000` atomic units of `0x036CbD53842c5426634e7929541eC2318f3dCF7e` on `eip155:84532`"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			s := testService()
			f := *s.Routes[0].Free
			s.Routes[0].Free = &f
			tc.mutate(&s)
			txt := string(LLMsTxt(s))
			for _, w := range tc.want {
				if !strings.Contains(txt, w) {
					t.Errorf("lacks %q", w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(txt, w) {
					t.Errorf("still says %q", w)
				}
			}
		})
	}
}

// FuzzDocuments feeds arbitrary base URLs (from the Host header when no
// public_base_url is configured) and operator texts to both builders: the
// OpenAPI document must stay valid JSON and nothing may panic.
func FuzzDocuments(f *testing.F) {
	f.Add("https://verify.example.com", "Verify an agent's JSON output", "GET /x/{id}")
	f.Add("http://[::1]:8080", "\"}\n# injected\n", "POST /a/:b")
	f.Add("", "\xff\xfe", "bogus")
	f.Fuzz(func(t *testing.T, base, desc, route string) {
		s := testService()
		s.BaseURL = base
		s.Routes[2].Description = desc
		if m, p, ok := ParseRoute(route); ok {
			s.Routes = append(s.Routes, Route{Method: m, Path: p, Description: desc, Accepts: []x402.PaymentRequirements{offer("7")}})
		}
		doc, err := OpenAPI(s)
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(doc) {
			t.Fatalf("not JSON: %.200s", doc)
		}
		txt := LLMsTxt(s)
		if !strings.HasPrefix(string(txt), "# ") {
			t.Fatal("llms.txt lost its title")
		}
		// Each input on its own: two invalid halves can join into a valid
		// sequence ("\xc8" + "\x85").
		if utf8.ValidString(base) && utf8.ValidString(desc) && utf8.ValidString(route) && !utf8.Valid(txt) {
			t.Fatal("valid UTF-8 input made invalid UTF-8 output")
		}
	})
}

func BenchmarkOpenAPI(b *testing.B) {
	s := testService()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := OpenAPI(s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLLMsTxt(b *testing.B) {
	s := testService()
	b.ReportAllocs()
	for b.Loop() {
		LLMsTxt(s)
	}
}

// A gate on POST /mcp without a tool charges every message to the
// endpoint: llms.txt and openapi.json state that price, not "no tool
// priced".
func TestDocsStateTheMCPEndpointsOwnPrice(t *testing.T) {
	s := testService()
	var routes []Route
	for _, r := range s.Routes {
		if r.Path != "/mcp" {
			routes = append(routes, r)
		}
	}
	s.Routes = append(routes, Route{Method: "POST", Path: "/mcp", Accepts: []x402.PaymentRequirements{offer("30000")}, Settle: "after"})
	llms := string(LLMsTxt(s))
	if want := "| `POST /mcp` | every message: $0.03 USDC (`30000`"; !strings.Contains(llms, want) {
		t.Errorf("llms.txt lacks %q", want)
	}
	if strings.Contains(llms, "no tool priced on this server") {
		t.Error("llms.txt says no tool is priced on an endpoint whose every message is")
	}
	b, err := OpenAPI(s)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Info map[string]any `json:"x-payment-info"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	info := doc.Paths["/mcp"]["post"].Info
	price, _ := info["price"].(map[string]any)
	if info["configured"] != true || price["amount"] != "30000" {
		t.Errorf("openapi.json /mcp x-payment-info = %v, want configured with amount 30000", info)
	}
}
