package svmfacilitator

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/x402"
)

// withMemo is p's payment with another memo: another transfer of the same
// buyer, from the same source token account.
func (p Payment) withMemo(memo string) []byte {
	ixs := p.Instructions()
	ixs[3] = MemoIx(memo)
	return p.Build(ixs)
}

// settleNoise lands n other payments of the env's buyer, each its own
// message, so the source token account has other transactions newer than
// the one looked for.
func (e *env) settleNoise(t testing.TB, n int) {
	t.Helper()
	for i := range n {
		pp := Payload(e.payment(t).withMemo(fmt.Sprintf("noise %d %d", i, time.Now().UnixNano())), e.req)
		if s, err := e.f.Settle(context.Background(), pp, e.req); err != nil || !s.Success {
			t.Fatalf("noise payment %d: %+v %v", i, s, err)
		}
	}
}

func (e *env) reader(t *testing.T) *StatusReader {
	t.Helper()
	r, err := NewStatusReader(&RPC{URL: e.chain.URL}, x402.NetworkSolanaDevnet)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// setBounds lowers the search's bounds for one test.
func setBounds(t *testing.T, page, fetched int) {
	op, of := searchPage, searchFetched
	searchPage, searchFetched = page, fetched
	t.Cleanup(func() { searchPage, searchFetched = op, of })
}

// A payment nobody named a transaction for is found on chain by its
// message: done with the fee payer's signature, past newer transfers of
// the same buyer (another message: not taken), across pages.
func TestSearchFindsTheLandedPayment(t *testing.T) {
	setBounds(t, 1, 64) // one signature per page: the cursor is used
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
	attempt := x402.SentSettlement{After: time.Now()} // the attempt began before the send
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	e.settleNoise(t, 2)
	st, err := e.reader(t).SentSettlementStatus(ctx, pp, e.req, attempt)
	if err != nil || st.State != x402.SettlementDone || st.Transaction != s.Transaction {
		t.Fatalf("%+v %v, want done with %s", st, err, s.Transaction)
	}
	// A payment of the same buyer that never landed is not mistaken for
	// one that did.
	other := Payload(e.payment(t).withMemo("never sent"), e.req)
	if st, err := e.reader(t).SentSettlementStatus(ctx, other, e.req, x402.SentSettlement{}); err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("a payment never sent, its blockhash valid: %+v %v", st, err)
	}
	e.chain.ExpireBlockhash()
	if st, err := e.reader(t).SentSettlementStatus(ctx, other, e.req, x402.SentSettlement{}); err != nil || st.State != x402.SettlementNever {
		t.Fatalf("a payment never sent, its blockhash expired: %+v %v", st, err)
	}
	// The landed one is still done once its blockhash expired.
	if st, err := e.reader(t).SentSettlementStatus(ctx, pp, e.req, attempt); err != nil || st.State != x402.SettlementDone || st.Transaction != s.Transaction {
		t.Fatalf("after expiry: %+v %v", st, err)
	}
	// A payment whose fee payer is not the offer's is not judged: its payer
	// could be its fee payer, and send it alone.
	foreign := e.req
	foreign.Extra = map[string]any{"feePayer": pub(e.payer).String()}
	if _, err := e.reader(t).SentSettlementStatus(ctx, pp, foreign, x402.SentSettlement{}); err == nil {
		t.Fatal("judged a payment whose fee payer is not the offer's")
	}
	other.Accepted.Network = x402.NetworkSolana
	if _, err := e.reader(t).SentSettlementStatus(ctx, other, other.Accepted, x402.SentSettlement{}); err == nil {
		t.Fatal("judged a payment on another network")
	}
}

// A send whose request was lost: undecided while its blockhash is valid,
// never once it expired (the buyer's other transfers are not taken for it),
// and nothing moved.
func TestSearchReleasesALostSend(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
	ctx := context.Background()
	pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
	if _, err := e.f.Settle(ctx, pp, e.req); !errors.As(err, new(*x402.UnknownOutcomeError)) {
		t.Fatalf("want an unknown outcome, got %v", err)
	}
	fr.set(func(f *faultyRPC) { f.dropSend = false })
	e.settleNoise(t, 1)
	r := e.reader(t)
	if st, err := r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{After: time.Now().Add(-time.Minute)}); err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("valid blockhash: %+v %v", st, err)
	}
	e.chain.ExpireBlockhash()
	if st, err := r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{After: time.Now().Add(-time.Minute)}); err != nil || st.State != x402.SettlementNever {
		t.Fatalf("expired blockhash: %+v %v", st, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d: only the noise payment may have moved", a, b)
	}
}

// A payment that landed and failed on chain is never, at once: the same
// message can never land again.
func TestSearchFailedOnChain(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	p := e.payment(t)
	p.Amount = 2_000_000 // over the buyer's balance: the transfer fails
	raw := p.Build(p.Instructions())
	tx, err := DecodeTransaction(raw)
	if err != nil {
		t.Fatal(err)
	}
	copy(tx.Signatures[0], ed25519.Sign(e.fee, tx.Message))
	sig, err := (&RPC{URL: e.chain.URL}).Send(ctx, raw)
	if err != nil {
		var re *RPCError
		errors.As(err, &re)
		t.Fatalf("%v %s", err, re.Data)
	}
	if st, _, _ := (&RPC{URL: e.chain.URL}).Status(ctx, sig, 0); st == nil || len(st.Err) == 0 || string(st.Err) == "null" {
		t.Fatalf("the transfer did not land failed (%+v); the test needs it to", st)
	}
	st, err := e.reader(t).SentSettlementStatus(ctx, Payload(raw, e.req), e.req, x402.SentSettlement{})
	if err != nil || st.State != x402.SettlementNever || st.Transaction != "" {
		t.Fatalf("%+v %v", st, err)
	}
}

// The search is bounded, and fails closed: a payment pushed out of reach by
// newer transactions of the same account (anyone may add them, the payer
// first) stays undecided, also once its blockhash expired, never "never".
func TestSearchBoundHitStaysUndecided(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		page, fetched int
	}{{"one page", 100, 2}, {"across pages", 1, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{})
			pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
			attempt := x402.SentSettlement{After: time.Now()}
			s, err := e.f.Settle(ctx, pp, e.req)
			if err != nil || !s.Success {
				t.Fatalf("settle: %+v %v", s, err)
			}
			e.settleNoise(t, 2)
			e.chain.ExpireBlockhash()
			missing := Payload(e.payment(t).withMemo("never sent"), e.req)
			e.chain.ExpireBlockhash()
			setBounds(t, tc.page, tc.fetched)
			for name, p := range map[string]x402.PaymentPayload{"landed": pp, "never sent": missing} {
				if st, err := e.reader(t).SentSettlementStatus(ctx, p, e.req, attempt); err != nil || st.State != x402.SettlementUndecided {
					t.Fatalf("%s, out of the bound: %+v %v", name, st, err)
				}
			}
			setBounds(t, 100, 64)
			if st, err := e.reader(t).SentSettlementStatus(ctx, pp, e.req, attempt); err != nil || st.State != x402.SettlementDone {
				t.Fatalf("within the bound: %+v %v", st, err)
			}
		})
	}
}

// After a restart the embedded facilitator holds no record, and still
// resolves: it signs the transaction's id again and asks the chain.
func TestSettlementStatusAfterARestart(t *testing.T) {
	ctx := context.Background()
	restart := func(t *testing.T, e *env) *Facilitator {
		f, err := New(Config{RPC: &RPC{URL: e.chain.URL}, Network: x402.NetworkSolanaDevnet, FeePayer: e.fee})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	t.Run("landed", func(t *testing.T) {
		fr := &faultyRPC{}
		srv := fr.serve(t)
		e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
		fr.set(func(f *faultyRPC) { f.target, f.dropSend, f.forwardOK, f.hideStatus = e.chain.URL, true, true, true })
		pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
		_, err := e.f.Settle(ctx, pp, e.req)
		var unknown *x402.UnknownOutcomeError
		if !errors.As(err, &unknown) || unknown.Reply == nil {
			t.Fatalf("want an unknown outcome, got %v", err)
		}
		f := restart(t, e)
		st, err := f.SettlementStatus(ctx, pp, e.req)
		if err != nil || st.State != x402.SettlementDone || st.Transaction != unknown.Reply.Transaction {
			t.Fatalf("%+v %v, want done with %s", st, err, unknown.Reply.Transaction)
		}
		// The gate that asked resolved its payment; a Settle of it now is a
		// replay.
		if s, err := f.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != unknown.Reply.Transaction || s.Payer != pub(e.payer).String() {
			t.Fatalf("a Settle after the resolution: %+v %v; want %s naming %s", s, err, ReasonDuplicateSettlement, unknown.Reply.Transaction)
		}
		if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
			t.Fatalf("balances payer %d payee %d", a, b)
		}
	})
	t.Run("lost send", func(t *testing.T) {
		fr := &faultyRPC{}
		srv := fr.serve(t)
		e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
		fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
		pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
		if _, err := e.f.Settle(ctx, pp, e.req); !errors.As(err, new(*x402.UnknownOutcomeError)) {
			t.Fatalf("want an unknown outcome, got %v", err)
		}
		// The restarted process holds neither the send's bytes nor a
		// Settle asked of it: its read sends nothing, and judges by the
		// chain alone.
		f := restart(t, e)
		if st, err := f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementUndecided {
			t.Fatalf("valid blockhash: %+v %v", st, err)
		}
		e.chain.ExpireBlockhash()
		if st, err := f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementNever {
			t.Fatalf("expired blockhash: %+v %v", st, err)
		}
		if a, b := e.balances(t); a != 1_000_000 || b != 0 {
			t.Fatalf("balances payer %d payee %d", a, b)
		}
	})
	t.Run("another fee payer", func(t *testing.T) {
		e := newEnv(t, Config{})
		p := e.payment(t)
		p.FeePayer = pub(testKey("someone else"))
		if _, err := restart(t, e).SettlementStatus(ctx, Payload(p.Build(p.Instructions()), e.req), e.req); err == nil {
			t.Fatal("judged a payment another fee payer would send")
		}
	})
}

// matchLanded takes a landed transaction only when it is the payment's
// message, byte for byte, under the fee payer's signature.
func TestMatchLanded(t *testing.T) {
	fee, payer := testKey("fee payer"), testKey("payer")
	var bh [32]byte
	bh[0] = 7
	p := Payment{FeePayer: pub(fee), Authority: payer, Mint: TokenProgram, Program: TokenProgram, PayTo: pub(testKey("payee")), Amount: 5, Decimals: 6, Blockhash: bh}
	raw := p.Build(p.Instructions())
	want, _ := DecodeTransaction(raw)
	signed := func(raw []byte, key ed25519.PrivateKey) ([]byte, string) {
		out := bytes.Clone(raw)
		tx, _ := DecodeTransaction(out)
		copy(tx.Signatures[0], ed25519.Sign(key, tx.Message))
		return out, base58.Encode(tx.Signatures[0])
	}
	landed := func(raw []byte, err string) *LandedTransaction {
		var lt LandedTransaction
		b, _ := json.Marshal(map[string]any{"slot": 3, "meta": map[string]any{"err": json.RawMessage(err)},
			"transaction": []string{base64.StdEncoding.EncodeToString(raw), "base64"}})
		json.Unmarshal(b, &lt)
		return &lt
	}
	good, sig := signed(raw, fee)
	other, otherSig := signed(p.withMemo("another transfer"), fee)
	forged, forgedSig := signed(raw, testKey("not the fee payer"))
	reslot := bytes.Clone(good)
	reslot[1+64+3] ^= 1 // the buyer's signature differs, the message is the same
	cases := []struct {
		name   string
		sig    string
		lt     *LandedTransaction
		ok     bool
		failed string
	}{
		{"the payment", sig, landed(good, "null"), true, ""},
		{"the payment, failed", sig, landed(good, `{"InstructionError":[2,{"Custom":1}]}`), true, `{"InstructionError":[2,{"Custom":1}]}`},
		{"the payment, another buyer signature", sig, landed(reslot, "null"), true, ""},
		{"another transfer of the buyer", otherSig, landed(other, "null"), false, ""},
		{"listed under another signature", otherSig, landed(good, "null"), false, ""},
		{"not signed by the fee payer", forgedSig, landed(forged, "null"), false, ""},
		{"no meta", sig, &LandedTransaction{Transaction: landed(good, "null").Transaction}, false, ""},
		{"not base64", sig, &LandedTransaction{Meta: landed(good, "null").Meta, Transaction: []string{"!!", "base64"}}, false, ""},
		{"base58 encoding", sig, &LandedTransaction{Meta: landed(good, "null").Meta, Transaction: []string{base58.Encode(good), "base58"}}, false, ""},
		{"truncated", sig, landed(good[:len(good)-1], "null"), false, ""},
		{"nil", sig, nil, false, ""},
	}
	for _, c := range cases {
		failed, ok := matchLanded(want, c.sig, c.lt)
		if ok != c.ok || failed != c.failed {
			t.Errorf("%s: ok %v failed %q, want %v %q", c.name, ok, failed, c.ok, c.failed)
		}
	}
}

// FuzzMatchLanded: whatever transaction bytes and error a node returns,
// matchLanded never panics and takes only the payment's own message under
// the fee payer's signature.
func FuzzMatchLanded(f *testing.F) {
	fee, payer := testKey("fee payer"), testKey("payer")
	p := Payment{FeePayer: pub(fee), Authority: payer, Mint: TokenProgram, Program: TokenProgram, PayTo: pub(testKey("payee")), Amount: 5, Decimals: 6}
	want, _ := DecodeTransaction(p.Build(p.Instructions()))
	good := bytes.Clone(want.Raw)
	gtx, _ := DecodeTransaction(good)
	copy(gtx.Signatures[0], ed25519.Sign(fee, gtx.Message))
	sig := base58.Encode(gtx.Signatures[0])
	f.Add(good, "null")
	f.Add(good, `{"InstructionError":[2,{"Custom":1}]}`)
	f.Add(p.withMemo("x"), "null")
	f.Add([]byte{1, 2, 3}, "")
	f.Fuzz(func(t *testing.T, raw []byte, errJSON string) {
		b, _ := json.Marshal(map[string]any{"meta": map[string]any{"err": json.RawMessage(errJSON)}, "transaction": []string{base64.StdEncoding.EncodeToString(raw), "base64"}})
		var lt LandedTransaction
		if json.Unmarshal(b, &lt) != nil {
			return
		}
		if _, ok := matchLanded(want, sig, &lt); ok {
			got, err := DecodeTransaction(raw)
			if err != nil || !bytes.Equal(got.Message, want.Message) || !bytes.Equal(got.Signatures[0], gtx.Signatures[0]) {
				t.Fatalf("took a transaction that is not the payment: %x", raw)
			}
		}
	})
}

// lyingNode is a FAKE FOR A FAULT no real chain produces on demand: a node
// whose getSignaturesForAddress pages are whatever page returns, whose
// getTransaction serves one other transaction for every signature, and
// whose blockhashes are all expired.
func lyingNode(t *testing.T, page func(before string) []SignatureInfo, other []byte) *RPC {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     json.RawMessage   `json:"id"`
			Method string            `json:"method"`
			Params []json.RawMessage `json:"params"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		var result any
		switch req.Method {
		case "getSignaturesForAddress":
			var cfg struct {
				Before string `json:"before"`
			}
			json.Unmarshal(req.Params[1], &cfg)
			result = page(cfg.Before)
		case "getTransaction":
			result = map[string]any{"slot": 1, "meta": map[string]any{"err": nil}, "transaction": []string{base64.StdEncoding.EncodeToString(other), "base64"}}
		case "isBlockhashValid":
			result = map[string]any{"context": map[string]any{"slot": 1}, "value": false}
		}
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result})
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return &RPC{URL: srv.URL}
}

// A node that lies about its listing gets no decision out of the search:
// pages out of order are an error, an endless history hits the bound
// (undecided, never "never"), and another transaction served under
// the listed signatures is not taken.
func TestSearchAgainstALyingNode(t *testing.T) {
	fee, payer := testKey("fee payer"), testKey("payer")
	p := Payment{FeePayer: pub(fee), Authority: payer, Mint: TokenProgram, Program: TokenProgram, PayTo: pub(testKey("payee")), Amount: 5, Decimals: 6}
	req := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet, Extra: map[string]any{"feePayer": pub(fee).String()}}
	pp := Payload(p.Build(p.Instructions()), req)
	other := p.withMemo("another transfer")
	entry := func(i int, slot uint64) SignatureInfo {
		return SignatureInfo{Signature: base58.Encode(bytes.Repeat([]byte{byte(i + 1)}, 64)), Slot: slot}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		page    func(before string) []SignatureInfo
		wantErr bool
	}{
		{"oldest first", func(string) []SignatureInfo { return []SignatureInfo{entry(0, 5), entry(1, 9)} }, true},
		{"endless history", func(string) []SignatureInfo {
			out := make([]SignatureInfo, searchPage)
			for i := range out {
				out[i] = entry(i, 100)
			}
			return out
		}, false},
		{"a short history of other transactions", func(string) []SignatureInfo { return []SignatureInfo{entry(0, 9), entry(1, 5)} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setBounds(t, 4, 8)
			r := &StatusReader{f: &Facilitator{rpc: lyingNode(t, tc.page, other), network: x402.NetworkSolanaDevnet}}
			st, err := r.SentSettlementStatus(ctx, pp, req, x402.SentSettlement{})
			if tc.wantErr != (err != nil) || st.State == x402.SettlementDone {
				t.Fatalf("%+v %v", st, err)
			}
			// Only a complete listing of other transactions, made after
			// the blockhash expired, is "never".
			if want := tc.name == "a short history of other transactions"; want != (st.State == x402.SettlementNever) {
				t.Fatalf("state %v", st.State)
			}
		})
	}
}

// FuzzLandedReply: any getTransaction result a node sends decodes (or is
// refused) without panic, and is taken only when it carries the payment.
func FuzzLandedReply(f *testing.F) {
	fee, payer := testKey("fee payer"), testKey("payer")
	p := Payment{FeePayer: pub(fee), Authority: payer, Mint: TokenProgram, Program: TokenProgram, PayTo: pub(testKey("payee")), Amount: 5, Decimals: 6}
	want, _ := DecodeTransaction(p.Build(p.Instructions()))
	good := bytes.Clone(want.Raw)
	gtx, _ := DecodeTransaction(good)
	copy(gtx.Signatures[0], ed25519.Sign(fee, gtx.Message))
	sig := base58.Encode(gtx.Signatures[0])
	b64 := base64.StdEncoding.EncodeToString(good)
	f.Add([]byte(`{"slot":3,"blockTime":null,"meta":{"err":null},"transaction":["` + b64 + `","base64"],"version":0}`))
	f.Add([]byte(`{"slot":3,"meta":{"err":{"InstructionError":[2,{"Custom":1}]}},"transaction":["` + b64 + `","base64"]}`))
	f.Add([]byte(`{"meta":null,"transaction":null}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, reply []byte) {
		var lt *LandedTransaction
		if json.Unmarshal(reply, &lt) != nil {
			return
		}
		if _, ok := matchLanded(want, sig, lt); ok {
			raw, err := base64.StdEncoding.DecodeString(lt.Transaction[0])
			got, derr := DecodeTransaction(raw)
			if err != nil || derr != nil || !bytes.Equal(got.Message, want.Message) || !bytes.Equal(got.Signatures[0], gtx.Signatures[0]) {
				t.Fatalf("took a reply that is not the payment: %s", reply)
			}
		}
	})
}

// The local chain's getSignaturesForAddress has a node's semantics, which
// the search relies on: newest first, limit, before and until, each entry
// with its slot, error, blockTime and confirmation status.
func TestChainListsSignaturesNewestFirst(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	e.settleNoise(t, 3)
	source := AssociatedTokenAddress(pub(e.payer), mustKey(solanachain.USDC), TokenProgram).String()
	rpc := &RPC{URL: e.chain.URL}
	all, err := rpc.SignaturesForAddress(ctx, source, "", 1000, 0)
	if err != nil || len(all) != 3 {
		t.Fatalf("%d entries %v", len(all), err)
	}
	for i, s := range all {
		if (i > 0 && s.Slot >= all[i-1].Slot) || s.BlockTime == nil || s.ConfirmationStatus != "finalized" || string(s.Err) != "null" {
			t.Fatalf("entry %d: %+v", i, s)
		}
	}
	sigs := func(list []SignatureInfo) (out []string) {
		for _, s := range list {
			out = append(out, s.Signature)
		}
		return out
	}
	if got, _ := rpc.SignaturesForAddress(ctx, source, "", 1, 0); !slices.Equal(sigs(got), sigs(all[:1])) {
		t.Fatalf("limit 1: %v", sigs(got))
	}
	if got, _ := rpc.SignaturesForAddress(ctx, source, all[0].Signature, 1000, 0); !slices.Equal(sigs(got), sigs(all[1:])) {
		t.Fatalf("before the newest: %v", sigs(got))
	}
	var until []SignatureInfo
	e.chain.Call("getSignaturesForAddress", &until, source, map[string]any{"until": all[2].Signature})
	if !slices.Equal(sigs(until), sigs(all[:2])) {
		t.Fatalf("until the oldest: %v", sigs(until))
	}
	for _, limit := range []int{0, 1001} {
		if _, err := rpc.SignaturesForAddress(ctx, source, "", limit, 0); err == nil {
			t.Fatalf("limit %d accepted", limit)
		}
	}
	if got, err := rpc.SignaturesForAddress(ctx, pub(testKey("nobody")).String(), "", 10, 0); err != nil || len(got) != 0 {
		t.Fatalf("an account with no history: %v %v", got, err)
	}
}
