package caddymodule

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// hugeIPCNode (FAULT: a lying or broken chain node) serves JSON-RPC on a
// unix socket, as geth's IPC endpoint does: eth_chainId is Base's, every
// other call a result of n hex digits. It returns the socket's path.
func hugeIPCNode(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "node.ipc")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	chunk := []byte(strings.Repeat("00", 32<<10))
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				dec := json.NewDecoder(bufio.NewReader(c))
				for {
					var req struct {
						ID     json.RawMessage `json:"id"`
						Method string          `json:"method"`
					}
					if dec.Decode(&req) != nil {
						return
					}
					if req.Method == "eth_chainId" {
						c.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":"0x2105"}` + "\n"))
						continue
					}
					c.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":"0x`))
					for sent := 0; sent < n; sent += len(chunk) {
						if _, err := c.Write(chunk); err != nil {
							return
						}
					}
					c.Write([]byte("\"}\n"))
				}
			}()
		}
	}()
	return path
}

// chainEndpointSites are the three options that name an EVM chain
// endpoint, each in a site that names endpoint there.
func chainEndpointSites(endpoint string) map[string]string {
	return map[string]string{
		"wallet_auth chain_rpc": `:{port} {
	route /api/* {
		wallet_auth required {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			chain_rpc ` + endpoint + `
			chain_timeout 2s
		}
		respond "ok"
	}
}
`,
		"evm rpc_url": fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept base $0.02 %s
			facilitator evm {
				network base
				rpc_url %s
				relayer_key %s
			}
			store badger {data}/gate
		}
		respond "ok"
	}
}
`, payTo.Hex(), endpoint, evmfacilitator.DevAccounts()[9].PrivateKeyHex),
		"facilitator http rpc": fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %s
			facilitator http {
				url http://127.0.0.1:1
				timeout 2s
				rpc devnet %s
			}
			store badger {data}/gate
		}
		respond "ok"
	}
}
`, payTo.Hex(), endpoint),
	}
}

// TestChainEndpointMustBeHTTPOrWebsocket: go-ethereum dials an IPC
// socket's path (and stdio) as readily as a URL, and its replies there
// are read whole, past the cap every other chain reply has. Each option
// that names an EVM chain endpoint refuses anything but an http(s) or
// ws(s) URL when the config loads, here a live IPC node's path, with an
// error that does not repeat it.
func TestChainEndpointMustBeHTTPOrWebsocket(t *testing.T) {
	path := hugeIPCNode(t, 64<<20)
	for option, site := range chainEndpointSites(path) {
		t.Run(option, func(t *testing.T) {
			err := tryLoadCaddy(t, freePort(t), site)
			if err == nil {
				caddy.Stop()
				t.Fatalf("%s given an IPC socket's path: the config loaded; want it refused", option)
			}
			if !strings.Contains(err.Error(), "not an http://, https://, ws:// or wss:// URL") || strings.Contains(err.Error(), path) {
				t.Errorf("error %q; want the endpoint refused as no http(s) or ws(s) URL, without its path", err)
			}
		})
	}
}

// stalledListener (FAULT: a chain endpoint that accepts the TCP connection
// and never answers, as an overloaded or black-holed node does) returns
// its address.
func stalledListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 64)
	t.Cleanup(func() {
		l.Close()
		close(held)
		for c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case held <- c: // held open, never answered
			default:
				c.Close()
			}
		}
	}()
	return l.Addr().String()
}

// TestStalledWebsocketChainEndpointFailsProvisioning: a ws:// chain
// endpoint connects when the config loads, and go-ethereum's websocket
// handshake has no deadline of its own. One that accepts and never
// answers fails the load within the option's bound (chain_timeout, the
// http facilitator's timeout, rpcDialTimeout for rpc_url), with an error
// that names the endpoint by its scheme and host, not by the credentials
// in its user, path or query.
func TestStalledWebsocketChainEndpointFailsProvisioning(t *testing.T) {
	defer func(d time.Duration) { rpcDialTimeout = d }(rpcDialTimeout)
	rpcDialTimeout = 2 * time.Second
	addr := stalledListener(t)
	endpoint := "ws://user:s3cretUser@" + addr + "/v3/s3cretPath?key=s3cretQuery"
	for option, site := range chainEndpointSites(endpoint) {
		t.Run(option, func(t *testing.T) {
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- tryLoadCaddy(t, freePort(t), site) }()
			select {
			case err := <-done:
				took := time.Since(start)
				if err == nil {
					caddy.Stop()
					t.Fatalf("a stalled ws:// endpoint: the config loaded; want it refused")
				}
				t.Logf("refused after %s: %v", took.Round(time.Millisecond), err)
				if took > 10*time.Second {
					t.Errorf("refused after %s; want within the option's 2 s bound", took)
				}
				if !strings.Contains(err.Error(), "ws://"+addr) || strings.Contains(err.Error(), "s3cret") {
					t.Errorf("error %q; want it to name ws://%s and none of the URL's credentials", err, addr)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("loading a config with %s naming a stalled ws:// endpoint still hangs after 30 s", option)
			}
		})
	}
}
