package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	_ "github.com/aovhq/aov/plugins/redisstore" // store redis
	"github.com/aovhq/aov/x402"
)

// discoverySite is a priced GET route (its gate settling through the
// facilitator of the same site) and the facilitator, whose discovery list
// is in store (a store directive body). {port} is the site's port. The
// devnet token is named in full, as a Caddy in another process has no
// devnet of its own to look it up in.
func discoverySite(d *evmfacilitator.Devnet, fac, gateStore, facStore string) string {
	return fmt.Sprintf(`:{port} {
	handle_path /facilitator/* {
		x402_facilitator {
			pay_to %[1]s
			store %[3]s
			discovery {
				origins http://127.0.0.1:{port}
			}
			http %[2]s
		}
	}
	route /thing/* {
		x402 {
			accept {
				network devnet
				amount 10000
				asset %[5]s
				asset_name "USD Coin"
				asset_version 2
				asset_decimals 6
				pay_to %[1]s
			}
			route "GET /thing/{id}"
			description "A thing"
			facilitator http http://127.0.0.1:{port}/facilitator
			store %[4]s
		}
		respond "a thing"
	}
}
`, payTo.Hex(), fac, facStore, gateStore, d.Token().Hex())
}

// payThing buys base/thing/<id> as an official client does (the 402's
// bazaar extension echoed in the payment) with development account payer.
func payThing(t *testing.T, base, id string, payer int) {
	t.Helper()
	resp, err := testClient.Get(base + "/thing/" + id)
	if err != nil {
		t.Fatal(err)
	}
	pr := paymentRequired(t, resp)
	resp.Body.Close()
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(payer), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	p.Extensions = pr.Extensions
	h, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/thing/"+id, nil)
	req.Header.Set(x402.HeaderPaymentSignature, h)
	resp, err = testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("paying /thing/%s: %d", id, resp.StatusCode)
	}
}

func listResources(t *testing.T, base string) x402.DiscoveryResources {
	t.Helper()
	resp, err := testClient.Get(base + "/facilitator/discovery/resources")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l x402.DiscoveryResources
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&l) != nil {
		t.Fatalf("discovery list: %d", resp.StatusCode)
	}
	return l
}

func listedResources(l x402.DiscoveryResources) string {
	var s []string
	for _, it := range l.Items {
		s = append(s, it.Resource)
	}
	return strings.Join(s, ",")
}

// TestDiscoveryListSurvivesAReload: the list is in the store, not in the
// handler a reload replaces.
func TestDiscoveryListSurvivesAReload(t *testing.T) {
	d, fac := sharedDevnet(t)
	dir := t.TempDir()
	site := discoverySite(d, fac, "badger "+filepath.Join(dir, "gate"), "badger "+filepath.Join(dir, "fac"))
	base := startCaddy(t, site)
	payThing(t, base, "a", 1)
	before := listResources(t, base)
	if listedResources(before) != base+"/thing/:id" {
		t.Fatalf("listed %q, want the route", listedResources(before))
	}
	var port int
	fmt.Sscanf(base, "http://127.0.0.1:%d", &port)
	loadCaddy(t, port, strings.Replace(site, `description "A thing"`, `description "A thing, reloaded"`, 1))
	if after := listResources(t, base); listedResources(after) != listedResources(before) || after.Items[0].LastUpdated != before.Items[0].LastUpdated {
		t.Fatalf("after a reload %+v, want %+v", after, before)
	}
}

// caddyProcess is a Caddy in a process of its own: this test binary run as
// TestDiscoveryHelperProcess with a Caddyfile in the environment.
type caddyProcess struct {
	cmd  *exec.Cmd
	base string
}

// startCaddyProcess runs sites (with {port} filled in) in a new process
// and waits until it answers.
func startCaddyProcess(t *testing.T, sites string) *caddyProcess {
	t.Helper()
	port := freePort(t)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\thttp_port %d\n\tstorage file_system %s\n\tlog {\n\t\toutput discard\n\t}\n}\n", port, t.TempDir())
	cfg += strings.ReplaceAll(sites, "{port}", fmt.Sprint(port))
	cmd := exec.Command(os.Args[0], "-test.run=^TestDiscoveryHelperProcess$")
	cmd.Env = append(os.Environ(), "AOV_TEST_CADDYFILE="+cfg)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &caddyProcess{cmd: cmd, base: fmt.Sprintf("http://127.0.0.1:%d", port)}
	t.Cleanup(p.kill)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := testClient.Get(p.base + "/facilitator/supported"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
	}
	t.Fatalf("Caddy process on %s did not answer", p.base)
	return nil
}

// kill ends the process at once (SIGKILL: no cleanup, as in a crash).
func (p *caddyProcess) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	}
}

// TestDiscoveryHelperProcess is the body of startCaddyProcess; run alone
// it does nothing.
func TestDiscoveryHelperProcess(t *testing.T) {
	cfg := os.Getenv("AOV_TEST_CADDYFILE")
	if cfg == "" {
		t.Skip("runs only as a Caddy process of another test")
	}
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatal(err)
	}
	// The parent kills this process; the deadline only bounds a parent
	// that died without doing so.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	<-ctx.Done()
}

// TestDiscoveryListSurvivesARestart: a Caddy killed without any cleanup,
// and a new process on the same Badger folders, lists what the first
// settled.
func TestDiscoveryListSurvivesARestart(t *testing.T) {
	d, fac := sharedDevnet(t)
	dir := t.TempDir()
	site := discoverySite(d, fac, "badger "+filepath.Join(dir, "gate"), "badger "+filepath.Join(dir, "fac"))
	first := startCaddyProcess(t, site)
	payThing(t, first.base, "a", 1)
	before := listResources(t, first.base)
	first.kill()
	second := startCaddyProcess(t, site)
	after := listResources(t, second.base)
	if after.Pagination.Total != 1 || listedResources(after) != first.base+"/thing/:id" || after.Items[0].LastUpdated != before.Items[0].LastUpdated {
		t.Fatalf("after a restart %+v, want %+v", after, before)
	}
}

// TestDiscoveryListSharedOnRedis: two Caddy processes whose facilitators
// keep the list on one Redis list the same resources, whichever settled
// them.
func TestDiscoveryListSharedOnRedis(t *testing.T) {
	d, fac := sharedDevnet(t)
	rdb := servers.StartRedis(t)
	st := "redis " + rdb.Addr
	a := startCaddyProcess(t, discoverySite(d, fac, st, st))
	b := startCaddyProcess(t, discoverySite(d, fac, st, st))
	payThing(t, a.base, "1", 1)
	time.Sleep(5 * time.Millisecond) // distinct last-seen milliseconds
	payThing(t, b.base, "2", 2)
	la, lb := listResources(t, a.base), listResources(t, b.base)
	want := b.base + "/thing/:id," + a.base + "/thing/:id"
	if listedResources(la) != want || listedResources(lb) != want || la.Pagination.Total != 2 {
		t.Fatalf("A lists %q, B lists %q; want both %q", listedResources(la), listedResources(lb), want)
	}
	ja, _ := json.Marshal(la)
	jb, _ := json.Marshal(lb)
	if string(ja) != string(jb) {
		t.Fatalf("the instances disagree:\n%s\n%s", ja, jb)
	}
}
