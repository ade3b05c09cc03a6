package caddymodule

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// fakeLookUpFailingNode is a FAKE FOR A FAULT: a node in front of the real
// local chain for the one fault the chain never produces by itself: with
// failLookUp set, the
// look-up before a send (getSignatureStatuses) fails as a proxy whose node
// is down, so the Settle ends without a verdict before sending (maySent).
type fakeLookUpFailingNode struct {
	failLookUp atomic.Bool
	sends      atomic.Int32
}

func (n *fakeLookUpFailingNode) start(t *testing.T, upstream string) string {
	u, _ := url.Parse(upstream)
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"sendTransaction"`)) {
			n.sends.Add(1)
		}
		if n.failLookUp.Load() && bytes.Contains(body, []byte(`"getSignatureStatuses"`)) {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"upstream unavailable"}}`))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// multiSettleUnsent settles one Solana payment through a multi whose members are
// the embedded svm facilitator (on the real local chain) plus, when
// withRemote, an http member for another network (an EVM remote, down):
// the look-up before the send fails once, then the gate's status reads
// (as its background pass or the buyer's retry make them) follow. It
// returns the last status and how much the payer was charged.
func multiSettleUnsent(t *testing.T, withRemote bool) (x402.SettlementStatus, int64) {
	e := newSolanaEnv(t)
	n := &fakeLookUpFailingNode{}
	node := n.start(t, e.chain.URL)
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: node}, Network: x402.NetworkSolanaDevnet,
		FeePayer: svmFeeKey(), ConfirmTimeout: 2 * time.Second, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	svm := &SVMFacilitator{f: f}
	fs := []x402.Facilitator{svm}
	if withRemote {
		// A remote for Base only (down: its /supported fails); it never
		// settles a Solana payment.
		remote := &HTTPFacilitator{f: x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: "http://127.0.0.1:1", Timeout: time.Second})}
		fs = []x402.Facilitator{remote, svm}
	}
	m := &MultiFacilitator{fs: fs}
	m.ready()

	sk, err := base58.Decode(e.payer.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	payerKey := ed25519.PrivateKey(sk)
	payee, _ := svmfacilitator.ParsePublicKey(e.payee.Address)
	mint, _ := svmfacilitator.ParsePublicKey(solanachain.USDC)
	bh, _ := svmfacilitator.ParsePublicKey(e.chain.LatestBlockhash())
	req := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet, Amount: "20000", Asset: solanachain.USDC,
		PayTo: e.payee.Address, MaxTimeoutSeconds: 60, Extra: map[string]any{"feePayer": f.FeePayer().String()}}
	pay := svmfacilitator.Payment{FeePayer: f.FeePayer(), Authority: payerKey, Mint: mint, Program: svmfacilitator.TokenProgram,
		PayTo: payee, Amount: 20000, Decimals: 6, Blockhash: bh}
	pp := svmfacilitator.Payload(pay.Transaction(), req)
	before := e.usdc(t, e.payer.Address)
	ctx := context.Background()

	n.failLookUp.Store(true)
	_, err = m.Settle(ctx, pp, req)
	n.failLookUp.Store(false)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != svmfacilitator.ReasonSettlementPending {
		t.Fatalf("settle: %v; want settlement_pending (nothing sent)", err)
	}
	if n.sends.Load() != 0 {
		t.Fatalf("%d sends; want none yet", n.sends.Load())
	}
	var st x402.SettlementStatus
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if st, err = m.SentSettlementStatus(ctx, pp, req, x402.SentSettlement{Transaction: unknown.Reply.Transaction}); err != nil {
			t.Fatalf("status: %v", err)
		}
		if st.State != x402.SettlementUndecided {
			break
		}
	}
	return st, before - e.usdc(t, e.payer.Address)
}

// A Solana payment whose Settle through a multi's svm member sent nothing
// (its look-up failed) is settled by the gate's next status read, with the
// svm member alone and with a remote member in the multi (for another
// network, down): the member the Settle asked sends it, not a peer.
// (Before: with any remote member every read went to PeerSettlementStatus,
// which never settled it, and the buyer waited for the blockhash to expire
// and signed again.)
func TestMultiStatusReadSettlesItsSVMMembersUnsentPayment(t *testing.T) {
	for _, withRemote := range []bool{false, true} {
		t.Run(map[bool]string{false: "svm alone", true: "with a remote member"}[withRemote], func(t *testing.T) {
			st, charged := multiSettleUnsent(t, withRemote)
			if st.State != x402.SettlementDone || charged != 20000 {
				t.Fatalf("status %+v, charged %d; want settled, charged 20000", st, charged)
			}
		})
	}
}
