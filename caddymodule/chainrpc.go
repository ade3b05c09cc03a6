package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/rpc"
)

// maxChainReply bounds each reply the gateway reads from an EVM chain
// RPC, as the Solana RPC client bounds its own: a stalled or lying node
// costs a bounded wait and nothing else. go-ethereum's client decodes a
// reply whole, at several times its size, and wallet_auth asks the chain
// for anyone's unauthenticated proof. What the gateway asks for is small:
// a chain id, a block header, a contract's code (24 KiB at most, EIP-170)
// and its answer, logs filtered down to one authorization. Receipts and
// transactions, which the chain bounds and not the gateway, are read
// under maxChainRecord (settlementChain).
const maxChainReply = 1 << 20

// maxChainRecord bounds a receipt or a transaction read to settle or to
// learn a settlement's outcome (settlementChain). The gateway does not
// choose its size: the transaction that used a payment's nonce may be a
// batch, or a smart wallet's bundle, carrying many logs, and a payment
// whose receipt could not be read would stay pending, the buyer charged
// and unserved, until its claim lapsed. The chain bounds it: a
// transaction's gas is at most 2^24 (EIP-7825). A receipt is mostly its
// logs: each costs at least 375 gas (an empty LOG0) and takes under 400
// bytes of JSON (geth answers 359), a topic 375 gas for 69 bytes, data 8
// gas for 2 bytes of hex, so 2^24 gas buys under 18 MiB. A transaction's
// input costs at least 4 gas a byte: under 8 MiB of hex. 32 MiB covers
// both with room for the fields a node adds. No request can make the
// gateway read one for free: receipts are read by the hash of a
// settlement transaction, the relayer's own or one the facilitator named,
// never of whatever transaction used a payment's nonce, which the payer
// may have sent (that one is judged by its logs and its call, the
// transaction read once per nonce and remembered: evmfacilitator's
// findNonceUse).
const maxChainRecord = 32 << 20

// dialChain dials the EVM chain RPC at endpoint (chain_rpc, a
// facilitator's rpc_url, `facilitator http`'s rpc) with each reply capped
// at max bytes: over HTTP by its transport, over a websocket by its
// message limit. A reply past the cap is an error of the call, as a node
// that does not answer is. Only http(s) and ws(s) endpoints are dialed
// (chainEndpoint): go-ethereum would also take an IPC socket's path or
// stdio, whose replies nothing would cap. The dial is bounded by timeout:
// a ws(s) endpoint connects here (an http(s) dial makes no request), and
// go-ethereum's websocket handshake has no deadline of its own. An error
// names the endpoint by its scheme and host only, never its user, path
// or query, where API keys go (a provider's key is often the path:
// https://base-mainnet.g.alchemy.com/v2/<key>): at the dial, and on every
// call after it, since an http(s) client is dialed at that name and its
// transport alone sends to the whole endpoint (endpointTransport), so the
// errors net/http makes of a call, which quote the URL they were given,
// quote the name. Every EVM chain client is made here.
func dialChain(ctx context.Context, endpoint string, timeout time.Duration, max int64) (*ethclient.Client, error) {
	name, err := chainEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var tr http.RoundTripper = cappedTransport{RoundTripper: http.DefaultTransport, max: max}
	dial := endpoint
	if u, _ := url.Parse(endpoint); u.Scheme == "http" || u.Scheme == "https" {
		tr, dial = endpointTransport{RoundTripper: tr, endpoint: u}, name
	}
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	c, err := rpc.DialOptions(ctx, dial, rpc.WithHTTPClient(client), rpc.WithWebsocketMessageSizeLimit(max))
	switch {
	case err != nil && ctx.Err() != nil, err != nil && errors.Is(err, os.ErrDeadlineExceeded):
		// The connection's deadline, which the dialer takes from ctx's,
		// may end it just before ctx ends.
		return nil, fmt.Errorf("connecting to %s: no answer within %s", name, timeout)
	case err != nil:
		return nil, fmt.Errorf("connecting to %s: %w", name, err)
	}
	return ethclient.NewClient(c), nil
}

// chainEndpoint checks that endpoint is an http, https, ws or wss URL
// with a host and returns its scheme and host, the name errors give it.
// The error names neither the endpoint nor anything in it.
func chainEndpoint(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err == nil && u.Host != "" {
		switch scheme := strings.ToLower(u.Scheme); scheme {
		case "http", "https", "ws", "wss":
			return scheme + "://" + u.Host, nil
		}
	}
	return "", errors.New("not an http://, https://, ws:// or wss:// URL with a host: a chain endpoint is read over HTTP or a websocket, whose replies the gateway bounds (an IPC socket path or stdio is refused)")
}

// settlementChain is the chain client of a facilitator (evm's rpc_url)
// and of a settlement status reader (`facilitator http`'s rpc): receipts
// and transactions are read through records, under maxChainRecord, and
// everything else, a contract's answer to a payment anyone can send among
// it, under maxChainReply.
type settlementChain struct {
	*ethclient.Client
	records *ethclient.Client
}

// dialSettlementChain dials endpoint twice for a settlementChain (two
// connections to a ws(s) endpoint), each dial bounded by timeout.
func dialSettlementChain(ctx context.Context, endpoint string, timeout time.Duration) (*settlementChain, error) {
	c, err := dialChain(ctx, endpoint, timeout, maxChainReply)
	if err != nil {
		return nil, err
	}
	records, err := dialChain(ctx, endpoint, timeout, maxChainRecord)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &settlementChain{Client: c, records: records}, nil
}

// TransactionReceipt reads a receipt under maxChainRecord.
func (c *settlementChain) TransactionReceipt(ctx context.Context, h common.Hash) (*types.Receipt, error) {
	return c.records.TransactionReceipt(ctx, h)
}

// TransactionByHash reads a transaction under maxChainRecord.
func (c *settlementChain) TransactionByHash(ctx context.Context, h common.Hash) (*types.Transaction, bool, error) {
	return c.records.TransactionByHash(ctx, h)
}

// Close closes both connections.
func (c *settlementChain) Close() {
	c.Client.Close()
	c.records.Close()
}

// endpointTransport sends every request to endpoint, whatever URL it was
// made for (the endpoint's scheme and host, dialChain), with endpoint's
// user and password, if any, as basic auth, as net/http would have sent
// them. A redirect is not followed (dialChain's client returns it as the
// reply, an error of the call): its request would go to the endpoint again.
type endpointTransport struct {
	http.RoundTripper
	endpoint *url.URL
}

func (t endpointTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	u := *t.endpoint
	u.User = nil
	r.URL, r.Host = &u, ""
	if t.endpoint.User != nil && r.Header.Get("Authorization") == "" {
		pw, _ := t.endpoint.User.Password()
		r.SetBasicAuth(t.endpoint.User.Username(), pw)
	}
	return t.RoundTripper.RoundTrip(r)
}

// cappedTransport caps the body of every reply of its transport at max
// bytes.
type cappedTransport struct {
	http.RoundTripper
	max int64
}

func (t cappedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.RoundTripper.RoundTrip(r)
	if err == nil {
		resp.Body = &cappedBody{ReadCloser: resp.Body, max: t.max, left: t.max}
	}
	return resp, err
}

// cappedBody reads at most left bytes of its body; a byte more is an
// error naming the cap, max.
type cappedBody struct {
	io.ReadCloser
	max, left int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.tooLarge()
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n - 1, b.tooLarge() // the byte past the cap is not given
	}
	return n, err
}

func (b *cappedBody) tooLarge() error {
	return fmt.Errorf("chain rpc reply over %d bytes", b.max)
}
