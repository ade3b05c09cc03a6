package caddymodule

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// A size past int64 (10EB) wrapped negative through the Caddyfile, and a
// negative free_allowance max_body made every request "too large" for the
// allowance: the free calls were never granted.
func TestSizePastInt64IsRefused(t *testing.T) {
	for _, tc := range []struct{ desc, directives, want string }{
		{"free_allowance max_body", "x402 {\n\tfree_allowance {\n\t\tmax_body 10EB\n\t}\n}", "max_body: 10EB is too large (at most 9223372036854775807 bytes), at Caddyfile:4"},
		{"the gate's max_body", "x402 {\n\tmax_body 10EB\n}", "max_body: 10EB is too large"},
		{"max_buffer", "x402 {\n\tmax_buffer 16EiB\n}", `max_buffer: bad size "16EiB"`},
		{"the largest size", "x402 {\n\taccept base $0.01 " + cfgPayTo + "\n\tfacilitator http http://127.0.0.1:1\n\tmax_body 9223372036854775807\n}", ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptFile(tc.directives), tc.want)
		})
	}
	t.Run("a negative free_allowance max_body in JSON", func(t *testing.T) {
		f := &FreeAllowance{PerDay: 5, MaxBody: -1}
		f.provision()
		wantErr(t, f.validate(), "max_body must not be negative")
	})
}

// asset_decimals: a word that is not a number is refused at its line, and
// a value that contradicts the decimals of the network's USDC (which the
// offer then uses, whatever the line says) is refused rather than ignored.
func TestAssetDecimalsErrors(t *testing.T) {
	acc := func(decimals string) string {
		return "x402 {\n\taccept {\n\t\tnetwork base\n\t\tprice $0.01\n\t\tpay_to " + cfgPayTo + "\n\t\tasset_decimals " + decimals + "\n\t}\n\tfacilitator http http://127.0.0.1:1\n}"
	}
	wantErr(t, adaptFile(acc("six")), `asset_decimals: "six" is not a whole number from 1 to 77 (price a token without decimals with amount), at Caddyfile:7`)
	wantErr(t, adaptFile(acc("-1")), `asset_decimals: "-1" is not a whole number from 1 to 77`)
	// 0 is the JSON's "unset", read as 6: a $1 price of a token without
	// decimals would ask a million of it.
	wantErr(t, adaptFile(acc("0")), `asset_decimals: "0" is not a whole number from 1 to 77`)
	for _, tc := range []struct{ desc, decimals, want string }{
		{"USDC's own decimals", "6", ""},
		{"other decimals on USDC", "18", "accept 0: asset_decimals 18 contradicts the 6 decimals of the network's USDC (drop it)"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, cfgLoad(t, cfgGate("accept {\n\t\t\t\tnetwork base\n\t\t\t\tprice $0.01\n\t\t\t\tpay_to "+cfgPayTo+"\n\t\t\t\tasset_decimals "+tc.decimals+"\n\t\t\t}", "")), tc.want)
		})
	}
}

// A single-value option given twice used to let the last one win without
// a word (a second facilitator, store or free_allowance replacing the
// first). Each is refused at its second line; options that add to a list
// (accept, origins, domains, pay_to, ...) still repeat.
func TestOptionGivenTwiceIsRefused(t *testing.T) {
	gate := func(extra string) string {
		return "x402 {\n\taccept base $0.01 " + cfgPayTo + "\n\tfacilitator http http://127.0.0.1:1\n\tstore badger /tmp/x\n" + extra + "\n}"
	}
	for _, tc := range []struct{ desc, directives, want string }{
		{"x402 facilitator", gate("\tfacilitator http http://127.0.0.1:2"), "facilitator given twice: it takes one value, and a second would silently replace the first, at Caddyfile:6"},
		{"x402 store", gate("\tstore badger /tmp/y"), "store given twice"},
		{"x402 settle", gate("\tsettle after\n\tsettle before"), "settle given twice: it takes one value, and a second would silently replace the first, at Caddyfile:7"},
		{"x402 free_allowance", gate("\tfree_allowance {\n\t\tper_day 1\n\t}\n\tfree_allowance {\n\t\tper_day 1000\n\t}"), "free_allowance given twice"},
		{"x402 payment_identifier", gate("\tpayment_identifier\n\tpayment_identifier required"), "payment_identifier given twice"},
		{"x402 rate_limit", gate("\trate_limit off\n\trate_limit 10 1m"), "rate_limit given twice"},
		{"x402 route", gate("\troute \"GET /a\"\n\troute \"POST /a\""), "route given twice"},
		{"x402 validate", gate("\tvalidate verify_request\n\tvalidate score_request"), "validate given twice"},
		{"x402 siwx", gate("\tsiwx\n\tsiwx example.com"), "siwx given twice"},
		{"accept network in the block and the arguments", "x402 {\n\taccept base $0.01 " + cfgPayTo + " {\n\t\tnetwork base-sepolia\n\t}\n}", "network given twice"},
		{"accept pay_to", "x402 {\n\taccept {\n\t\tpay_to " + cfgPayTo + "\n\t\tpay_to " + cfgPayTo + "\n\t}\n}", "pay_to given twice"},
		{"free_allowance per_day", "x402 {\n\tfree_allowance {\n\t\tper_day 1\n\t\tper_day 5\n\t}\n}", "per_day given twice"},
		{"rate_limit events after the short form", "x402 {\n\trate_limit 10 1m {\n\t\tevents 5\n\t}\n}", "events given twice"},
		{"payment_identifier window", "x402 {\n\tpayment_identifier {\n\t\twindow 1h\n\t\twindow 2h\n\t}\n}", "window given twice"},
		{"paywall app_name", "x402 {\n\tpaywall official {\n\t\tapp_name a\n\t\tapp_name b\n\t}\n}", "app_name given twice"},
		{"store badger path", "x402 {\n\tstore badger /tmp/a {\n\t\tpath /tmp/b\n\t}\n}", "path given twice"},
		{"x402_discovery", "x402_discovery {\n\tinstructions a\n\tinstructions b\n}", "instructions given twice"},
		{"wallet_auth mode", "wallet_auth required {\n\tmode optional\n}", "mode given twice"},
		{"wallet_auth store", "wallet_auth {\n\tstore badger /tmp/a\n\tstore badger /tmp/b\n}", "store given twice"},
		{"x402_facilitator min_price", "x402_facilitator {\n\tmin_price $0.01\n\tmin_price $0.0001\n\tdevnet\n}", "min_price given twice"},
		{"x402_facilitator discovery", "x402_facilitator {\n\tdiscovery off\n\tdiscovery {\n\t\tmax_entries 5\n\t}\n\tdevnet\n}", "discovery given twice"},
		{"x402_facilitator discovery max_age", "x402_facilitator {\n\tdiscovery {\n\t\tmax_age 1h\n\t\tmax_age 2h\n\t}\n\tdevnet\n}", "max_age given twice"},
		{"http facilitator url", "x402 {\n\tfacilitator http http://127.0.0.1:1 {\n\t\turl http://127.0.0.1:2\n\t}\n}", "url given twice"},
		{"http facilitator header", "x402 {\n\tfacilitator http http://127.0.0.1:1 {\n\t\theader Authorization a\n\t\theader Authorization b\n\t}\n}", "header Authorization given twice: a second would silently replace the first, at Caddyfile:5"},
		{"evm facilitator rpc_url", "x402 {\n\tfacilitator evm {\n\t\tnetwork base\n\t\trpc_url http://127.0.0.1:1\n\t\trpc_url http://127.0.0.1:2\n\t}\n}", "rpc_url given twice"},
		{"evm facilitator devnet rpc_listen", "x402 {\n\tfacilitator evm {\n\t\tdevnet {\n\t\t\trpc_listen 127.0.0.1:1\n\t\t\trpc_listen 127.0.0.1:2\n\t\t}\n\t}\n}", "rpc_listen given twice"},
		{"svm facilitator network", "x402 {\n\tfacilitator svm {\n\t\tnetwork solana\n\t\tnetwork solana-devnet\n\t}\n}", "network given twice"},
		{"x402_cors max_age", "x402_cors https://a.example {\n\tmax_age 1h\n\tmax_age 2h\n}", "max_age given twice"},
		{"aov_rate_limit window", "aov_rate_limit {\n\twindow 1m\n\twindow 1h\n}", "window given twice"},
		{"verify_response schema", "verify_response {\n\tschema a.json\n\tschema b.json\n}", "schema given twice"},
		{"aov_docs service_name", "aov_docs {\n\tservice_name a\n\tservice_name b\n}", "service_name given twice"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptFile(tc.directives), tc.want)
		})
	}
	// Options that add to a list still repeat.
	for _, tc := range []struct{ desc, directives string }{
		{"two accept offers", "x402 {\n\taccept base $0.01 " + cfgPayTo + "\n\taccept base-sepolia $0.01 " + cfgPayTo + "\n\tfacilitator http http://127.0.0.1:1\n}"},
		{"wallet_auth domains", "wallet_auth {\n\tdomains a.example\n\tdomains b.example\n}"},
		{"x402_cors origins", "x402_cors {\n\torigins https://a.example\n\torigins https://b.example\n}"},
		{"x402_facilitator pay_to", "x402_facilitator {\n\tpay_to " + cfgPayTo + "\n\tpay_to 0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC\n\tdevnet\n}"},
		{"verify_response status", "verify_response {\n\tstatus 200\n\tstatus 201\n}"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptFile(tc.directives), "")
		})
	}
}

// adaptFile adapts directives in a site block of a file named Caddyfile, so
// that errors carry the file and line (the directives start on line 2).
func adaptFile(directives string) error {
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":8080 {\n"+directives+"\n}\n"), map[string]any{"filename": "Caddyfile"})
	return err
}

// A JSON config (no Caddyfile parser on the way) gets the same asset_decimals
// range as the Caddyfile: 0 is unset (6), anything else from 1 to 77, for a
// priced offer and an amount offer alike. A config with 100 or -1 loaded,
// and named prices in decimals no token can have.
func TestAssetDecimalsOutOfRangeInJSON(t *testing.T) {
	for _, pricing := range []string{"price $0.01", "amount 1000"} {
		site := cfgGate("accept {\n\t\t\t\tnetwork base\n\t\t\t\t"+pricing+"\n\t\t\t\tasset 0x1111111111111111111111111111111111111111\n\t\t\t\tasset_name Tok\n\t\t\t\tasset_version 1\n\t\t\t\tasset_decimals 18\n\t\t\t\tpay_to "+cfgPayTo+"\n\t\t\t}", "")
		port := freePort(t)
		cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\thttp_port %d\n\tstorage file_system %s\n\tlog {\n\t\toutput discard\n\t}\n}\n", port, t.TempDir())
		cfg += strings.NewReplacer("{port}", fmt.Sprint(port), "{data}", t.TempDir()).Replace(site)
		js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
		if err != nil || !bytes.Contains(js, []byte(`"asset_decimals":18`)) {
			t.Fatalf("adapting: %v\n%s", err, js)
		}
		for _, n := range []string{"100", "78", "-1"} {
			t.Run(pricing+" "+n, func(t *testing.T) {
				err := caddy.Load(bytes.Replace(js, []byte(`"asset_decimals":18`), []byte(`"asset_decimals":`+n), 1), true)
				if err == nil {
					caddy.Stop()
				}
				wantErr(t, err, "accept 0: asset_decimals "+n+" is not a whole number from 1 to 77 (price a token without decimals with amount)")
			})
		}
		t.Run(pricing+" 77", func(t *testing.T) {
			err := caddy.Load(bytes.Replace(js, []byte(`"asset_decimals":18`), []byte(`"asset_decimals":77`), 1), true)
			if err == nil {
				caddy.Stop()
			}
			wantErr(t, err, "")
		})
	}
}

// A JSON config's upstream_timeout gets the Caddyfile's rule: a positive
// duration. A negative one loaded, and every charged or free call then
// failed at once (its deadline already past).
func TestUpstreamTimeoutNotPositiveInJSON(t *testing.T) {
	site := cfgGate("accept devnet $0.02 "+cfgPayTo, "upstream_timeout 5s")
	port := freePort(t)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\thttp_port %d\n\tstorage file_system %s\n\tlog {\n\t\toutput discard\n\t}\n}\n", port, t.TempDir())
	cfg += strings.NewReplacer("{port}", fmt.Sprint(port), "{data}", t.TempDir()).Replace(site)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil || !bytes.Contains(js, []byte(`"upstream_timeout":5000000000`)) {
		t.Fatalf("adapting: %v\n%s", err, js)
	}
	for _, n := range []string{"-1000000000", "-1"} {
		t.Run(n, func(t *testing.T) {
			err := caddy.Load(bytes.Replace(js, []byte(`"upstream_timeout":5000000000`), []byte(`"upstream_timeout":`+n), 1), true)
			if err == nil {
				caddy.Stop()
			}
			wantErr(t, err, "upstream_timeout "+time.Duration(mustAtoi(t, n)).String()+" must be positive")
		})
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
