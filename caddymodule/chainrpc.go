package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/rpc"
)

// maxChainReply bounds each reply the gateway reads from an EVM chain
// RPC, as the Solana RPC client bounds its own: a stalled or lying node
// costs a bounded wait and nothing else. go-ethereum's client decodes a
// reply whole, at several times its size, and wallet_auth asks the chain
// for anyone's unauthenticated proof. What the gateway asks for is small:
// a chain id, a block header, a contract's code (24 KiB at most, EIP-170)
// and its answer, a receipt, logs filtered down to one authorization.
const maxChainReply = 1 << 20

// chainHTTPClient is the HTTP client of every EVM chain RPC the gateway
// dials (dialChain): the default transport, each reply capped.
var chainHTTPClient = &http.Client{Transport: cappedTransport{http.DefaultTransport}}

// dialChain dials the EVM chain RPC at url (chain_rpc, a facilitator's
// rpc_url, `facilitator http`'s rpc) with each reply capped at
// maxChainReply: over HTTP through chainHTTPClient, over a websocket by
// its message limit. A reply past the cap is an error of the call, as a
// node that does not answer is. ctx bounds a websocket's connection
// only; an http(s) dial makes no request.
func dialChain(ctx context.Context, url string) (*ethclient.Client, error) {
	c, err := rpc.DialOptions(ctx, url, rpc.WithHTTPClient(chainHTTPClient), rpc.WithWebsocketMessageSizeLimit(maxChainReply))
	if err != nil {
		return nil, err
	}
	return ethclient.NewClient(c), nil
}

// cappedTransport caps the body of every reply of its transport at
// maxChainReply bytes.
type cappedTransport struct{ http.RoundTripper }

func (t cappedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.RoundTripper.RoundTrip(r)
	if err == nil {
		resp.Body = &cappedBody{ReadCloser: resp.Body, left: maxChainReply}
	}
	return resp, err
}

// errChainReplyTooLarge is the error of a read past maxChainReply.
var errChainReplyTooLarge = fmt.Errorf("chain rpc reply over %d bytes", maxChainReply)

// cappedBody reads at most left bytes of its body; a byte more is
// errChainReplyTooLarge.
type cappedBody struct {
	io.ReadCloser
	left int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, errChainReplyTooLarge
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n - 1, errChainReplyTooLarge // the byte past the cap is not given
	}
	return n, err
}
