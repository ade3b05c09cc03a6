package caddymodule

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// TestCaddyfileAdapt checks every directive form against golden files in
// testdata/adapt: a Caddyfile, a line of ten dashes, the expected JSON.
// Run with -update to rewrite the expected halves after a deliberate change.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/adapt/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no adapt cases: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			input, want, ok := strings.Cut(string(raw), "\n----------\n")
			if !ok {
				t.Fatalf("%s has no ---------- separator", file)
			}
			got := adapt(t, input)
			if *update {
				os.WriteFile(file, []byte(input+"\n----------\n"+got), 0o644)
				return
			}
			if strings.TrimSpace(got) != strings.TrimSpace(want) {
				t.Errorf("adapted JSON differs\n--- got\n%s\n--- want\n%s", got, want)
			}
		})
	}
}

func adapt(t *testing.T, caddyfile string) string {
	t.Helper()
	a := caddyconfig.GetAdapter("caddyfile")
	out, warnings, err := a.Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	for _, w := range warnings {
		t.Logf("warning: %s", w.String())
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	return buf.String() + "\n"
}

func TestCaddyfileErrors(t *testing.T) {
	cases := []struct {
		desc, caddyfile, want string
	}{
		{"an unknown option is named", "x402 {\n\tbogus 1\n}", "unrecognized x402 option 'bogus'"},
		{"accept shorthand needs three arguments", "x402 {\n\taccept base $0.02\n}", "accept takes either no arguments"},
		{"an unknown accept option is named", "x402 {\n\taccept {\n\t\tcolour red\n\t}\n}", "unrecognized accept option 'colour'"},
		{"per_day must be a number", "x402 {\n\tfree_allowance {\n\t\tper_day many\n\t}\n}", "per_day"},
		{"a size must parse", "x402 {\n\tmax_body lots\n}", "bad size"},
		{"an unknown free_allowance option is named", "x402 {\n\tfree_allowance {\n\t\tcolour red\n\t}\n}", "unrecognized free_allowance option"},
		{"x402 takes no inline arguments", "x402 extra", "wrong argument count"},
		{"discovery options are checked", "x402_discovery {\n\tcolour red\n}", "unrecognized x402_discovery option"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			a := caddyconfig.GetAdapter("caddyfile")
			_, _, err := a.Adapt([]byte(":8080 {\n"+tc.caddyfile+"\n}\n"), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestAcceptRequirements(t *testing.T) {
	const payTo = "0x1111111111111111111111111111111111111111"
	cases := []struct {
		desc    string
		accept  Accept
		amount  string
		wantErr string
	}{
		{"a dollar price becomes exact atomic units of USDC", Accept{Network: "base", Price: "$0.02", PayTo: payTo}, "20000", ""},
		{"an atomic amount passes through", Accept{Network: "eip155:8453", Amount: "10000", PayTo: payTo}, "10000", ""},
		{"price and amount together are refused", Accept{Network: "base", Price: "$0.02", Amount: "20000", PayTo: payTo}, "", "not both"},
		{"a price finer than the asset is refused", Accept{Network: "base", Price: "$0.0000001", PayTo: payTo}, "", "decimal"},
		{"an unknown network is refused", Accept{Network: "mars", Price: "$1", PayTo: payTo}, "", "mars"},
		{"pay_to is required", Accept{Network: "base", Price: "$1"}, "", "pay_to is required"},
		{"a mistyped checksummed pay_to is refused", Accept{Network: "base", Price: "$1", PayTo: "0x70997970C51812dc3A010C7d01b50e0d17dc79c8"}, "", "pay_to"},
		{"only the exact scheme is supported", Accept{Scheme: "upto", Network: "base", Price: "$1", PayTo: payTo}, "", "not supported"},
		{"a custom EVM asset needs its EIP-712 domain", Accept{Network: "base", Amount: "1", Asset: "0x2222222222222222222222222222222222222222", PayTo: payTo}, "", "asset_name"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			req, err := tc.accept.requirements()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if req.Amount != tc.amount || req.Scheme != "exact" || req.MaxTimeoutSeconds != 60 || req.Extra["name"] != "USD Coin" {
				t.Fatalf("requirements %+v", req)
			}
		})
	}
}
