package walletauth

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"
)

// stallingRPC is a fake JSON-RPC chain for the one fault a real chain
// cannot be made to show on demand: an RPC that takes a request and never
// answers. Methods in stall hang until the client gives up (or release is
// closed); eth_chainId otherwise answers chainID, eth_getCode some code
// (so the check goes on to ask the contract) and eth_call "0x" (not
// EIP-1271's answer: not a valid signature). It counts the calls it got
// and the ones whose client hung up waiting.
type stallingRPC struct {
	*httptest.Server
	chainID string
	stall   map[string]bool
	release chan struct{}

	mu        sync.Mutex
	calls     map[string]int
	abandoned map[string]int
	arrived   chan string // each call's method, as it arrives
}

func newStallingRPC(t *testing.T, chainID string, stall ...string) *stallingRPC {
	t.Helper()
	s := &stallingRPC{chainID: chainID, stall: map[string]bool{}, release: make(chan struct{}),
		calls: map[string]int{}, abandoned: map[string]int{}, arrived: make(chan string, 64)}
	for _, m := range stall {
		s.stall[m] = true
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.Release()
		s.Close()
	})
	return s
}

// Release lets stalled calls (and every later one) answer.
func (s *stallingRPC) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.release:
	default:
		close(s.release)
	}
}

func (s *stallingRPC) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "one JSON-RPC call per request", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.calls[req.Method]++
	s.mu.Unlock()
	s.arrived <- req.Method
	if s.stall[req.Method] {
		select {
		case <-r.Context().Done():
			s.mu.Lock()
			s.abandoned[req.Method]++
			s.mu.Unlock()
			return
		case <-s.release:
		}
	}
	result := `"0x"`
	switch req.Method {
	case "eth_chainId":
		result = `"` + s.chainID + `"`
	case "eth_getCode":
		result = `"0x00"`
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":` + result + `}`))
}

func (s *stallingRPC) count(m map[string]int, method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return m[method]
}

// waitAbandoned waits until the client hung up on a stalled call of method.
func (s *stallingRPC) waitAbandoned(t *testing.T, method string) {
	t.Helper()
	for range 3000 {
		if s.count(s.abandoned, method) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the client never hung up on its stalled %s", method)
}

// notRecovering is an X-Wallet-Auth header naming testKey's address but
// signed by otherKey: recovery fails, so the verifier asks the chain
// whether the address is a contract wallet that accepts it. Anyone can
// send such a header.
func notRecovering(t *testing.T, chainID string) string {
	e := envelope(t)
	e.ChainID = chainID
	e.Nonce = NewNonce()
	signed(t, e, otherKey)
	e.Address = crypto.PubkeyToAddress(testKey.PublicKey).Hex()
	h, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// verifyOrHang runs Verify, failing the test if it has not returned after a
// minute: far beyond any timeout the test sets, so it detects a verifier
// that waits without a deadline, never a slow machine.
func verifyOrHang(t *testing.T, ctx context.Context, v *Verifier, h string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { _, err := v.Verify(ctx, h, want); done <- err }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("Verify is still waiting on a stalled chain after a minute: chain calls have no deadline")
		return nil
	}
}

// wantOutage checks that err is a failed check (the gateway's 503), not a
// refusal, and that it was the verifier's deadline that ended it.
func wantOutage(t *testing.T, err error) {
	t.Helper()
	var we *Error
	if err == nil || errors.As(err, &we) {
		t.Fatalf("error %v, want an outage (503), not a refusal", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v, want the chain timeout's context.DeadlineExceeded", err)
	}
}

// Every chain call of the contract-wallet check has a deadline of its own:
// a chain that takes the call and never answers makes the check fail (the
// gateway's 503) within ChainTimeout, and the connection is dropped, even
// though the request's own context never ends.
func TestChainCallsHaveADeadline(t *testing.T) {
	for _, method := range []string{"eth_chainId", "eth_getCode", "eth_call"} {
		t.Run(method, func(t *testing.T) {
			rpc := newStallingRPC(t, "0x2105", method)
			c, err := ethclient.Dial(rpc.URL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			// A second, not less: the bound covers every call of the check,
			// and on a loaded machine the calls before the stalled one
			// could spend a shorter one before it is even sent, leaving
			// nothing to hang up on.
			v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Minute)), Chain: c, ChainTimeout: time.Second}
			wantOutage(t, verifyOrHang(t, context.Background(), v, notRecovering(t, "eip155:8453")))
			if rpc.count(rpc.calls, method) == 0 {
				t.Fatalf("the check gave up before its %s reached the chain", method)
			}
			rpc.waitAbandoned(t, method)
		})
	}
}

// The chain id is asked once, without a lock held across the call: while
// one request waits for a stalled eth_chainId, another contract-wallet
// check is not queued behind it (it waits on the same answer, but only as
// long as its own context lets it), and no second eth_chainId is sent.
func TestChainIDIsAskedOnceWithoutALock(t *testing.T) {
	rpc := newStallingRPC(t, "0x2105", "eth_chainId")
	c, err := ethclient.Dial(rpc.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Minute)), Chain: c, ChainTimeout: time.Hour}

	first := make(chan error, 1)
	go func() { _, err := v.Verify(context.Background(), notRecovering(t, "eip155:8453"), want); first <- err }()
	if m := <-rpc.arrived; m != "eth_chainId" {
		t.Fatalf("first call %s, want eth_chainId", m)
	}

	// A second check whose client is gone returns at once.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	err = verifyOrHang(t, gone, v, notRecovering(t, "eip155:8453"))
	var we *Error
	if !errors.Is(err, context.Canceled) || errors.As(err, &we) {
		t.Fatalf("second check: %v, want its own context's cancellation", err)
	}

	rpc.Release()
	var ferr error
	select {
	case ferr = <-first:
	case <-time.After(time.Minute):
		t.Fatal("the first check did not return after the chain answered")
	}
	if !errors.Is(ferr, ErrBadSignature) {
		t.Fatalf("first check: %v, want the chain's no (ErrBadSignature)", ferr)
	}
	// Known now: a third check asks only isValidSignature.
	if err := verifyOrHang(t, context.Background(), v, notRecovering(t, "eip155:8453")); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("third check: %v", err)
	}
	if n := rpc.count(rpc.calls, "eth_chainId"); n != 1 {
		t.Errorf("eth_chainId asked %d times, want once", n)
	}
}
