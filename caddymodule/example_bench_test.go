package caddymodule

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// BenchmarkExampleFreePath and BenchmarkExampleBaseline are `make load`'s
// free and baseline scenarios in process: Caddyfile.example's own site
// (every handler, matcher and log around the gate) serving a free
// verification, against load/baseline.Caddyfile's plain reverse_proxy, both
// to the same upstream and with their access logs written. Their difference
// in allocs/op and cpu-ns/op is what the example's site costs over the plain
// proxy; the CPU is the whole process's (client, Caddy and upstream), so
// compare runs of the two taken in turn.
func BenchmarkExampleFreePath(b *testing.B) {
	base := startExampleCaddy(b, "../Caddyfile.example", "AOV_HTTP_PORT")
	runPosts(b, base+"/verify/schema", nil)
}

func BenchmarkExampleBaseline(b *testing.B) {
	base := startExampleCaddy(b, "../load/baseline.Caddyfile", "AOV_BASELINE_PORT")
	runPosts(b, base+"/verify/schema", nil)
}

// startExampleCaddy loads the Caddyfile at path, as scripts/load.sh runs it,
// with its ports, folders and upstream from the environment: its site on a
// free port named by portVar, verifierd's address an upstream that answers
// with verifierd's headers; env are more variables, name then value. It
// returns the site's base URL.
func startExampleCaddy(b testing.TB, path, portVar string, env ...string) string {
	b.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		io.WriteString(w, `{"result":"pass","summary":{"result":"pass","blocking_checks":[]}}`)
	}))
	b.Cleanup(up.Close)
	port := freePort(b)
	for k, v := range map[string]string{
		portVar:                 fmt.Sprint(port),
		"AOV_VERIFIERD_ADDR":    strings.TrimPrefix(up.URL, "http://"),
		"AOV_ADMIN_ADDR":        fmt.Sprintf("127.0.0.1:%d", freePort(b)),
		"AOV_FACILITATOR":       "bench",
		"AOV_LOG_DIR":           b.TempDir(),
		"AOV_FREE_PER_DAY":      "1000000000",
		"AOV_GATE_RATE":         "1000000000",
		"AOV_PUBLIC_BASE_URL":   fmt.Sprintf("http://localhost:%d", port),
		"AOV_GATEWAY_TOKEN":     "bench-token",
		"AOV_SOLANA_RPC_ADDR":   fmt.Sprintf("127.0.0.1:%d", freePort(b)),
		"AOV_CERTD_PUBLIC_ADDR": fmt.Sprintf("127.0.0.1:%d", freePort(b)),
	} {
		b.Setenv(k, v)
	}
	for i := 0; i+1 < len(env); i += 2 { // the caller's, over the above
		b.Setenv(env[i], env[i+1])
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	// The free path never calls the facilitator: the instant one stands in
	// for the devnet (AOV_FACILITATOR=bench), whose chain would add its own
	// background work to every call's CPU; the Solana one (no chain behind
	// it) gives the Solana offers their fee payer.
	if bytes.Contains(raw, []byte("{$AOV_FACILITATOR:")) {
		anchor := []byte("\n(verifierd) {")
		if !bytes.Contains(raw, anchor) {
			b.Fatalf("%s has no (verifierd) snippet to put the benchmark's facilitator before", path)
		}
		raw = bytes.Replace(raw, anchor, append([]byte(benchFacilitatorSnippets), anchor...), 1)
	}
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(raw, map[string]any{"filename": path})
	if err != nil {
		b.Fatal(err)
	}
	if err := caddy.Load(js, true); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { caddy.Stop() })
	waitServing(b, port)
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

// benchFacilitatorSnippets are the payment_ and facilitator_api_ snippets
// Caddyfile.example imports with AOV_FACILITATOR=bench.
const benchFacilitatorSnippets = `
(payment_bench) {
	facilitator multi {
		instant_benchmark_only
		svm {
			network solana-devnet
			rpc_url http://{$AOV_SOLANA_RPC_ADDR}
			dev_fee_payer
		}
	}
}

(facilitator_api_bench) {
	respond 404
}
`
