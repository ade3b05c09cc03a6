package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// Deadlines the fault tests configure through Caddyfile.example's settings,
// shorter than the defaults so the tests stay quick.
const (
	testUpstreamTimeout = 2 * time.Second
	testReadBodyTimeout = 3 * time.Second
	// deadlineMargin is what a request may take beyond its configured
	// deadline on a loaded two-core machine (scheduling, the 503's write).
	deadlineMargin = 3 * time.Second
)

// faultStack starts a stack whose upstream and body deadlines are short.
func faultStack(t *testing.T, env ...string) *stack {
	t.Helper()
	return newStack(t, append([]string{
		"AOV_UPSTREAM_TIMEOUT=" + testUpstreamTimeout.String(),
		"AOV_READ_BODY_TIMEOUT=" + testReadBodyTimeout.String(),
	}, env...)...)
}

// pause stops p's process group with SIGSTOP, the way a hung daemon looks
// from outside: its listening socket still accepts connections (the
// kernel completes the handshake) but nothing answers. The test resumes it
// when it ends, so its cleanup can stop it.
func (p *proc) pause(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s: %v", p.name, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT) })
	p.waitStopped(t)
}

// waitStopped returns once every thread of the process is stopped. kill
// returns when SIGSTOP is queued, not when it has taken effect: a thread
// running on the other processor can still answer a request for a moment,
// and a test that then expects a stall sees an answer.
func (p *proc) waitStopped(t testing.TB) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", p.cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		tasks, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("reading %s's threads: %v", p.name, err)
		}
		stopped := true
		for _, task := range tasks {
			stat, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
			// The state follows the command name's closing parenthesis.
			if i := bytes.LastIndexByte(stat, ')'); err == nil && i >= 0 && i+2 < len(stat) && stat[i+2] != 'T' && stat[i+2] != 't' {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not stop within 5 s of SIGSTOP", p.name)
		}
	}
}

// kill ends a process at once (SIGKILL), as a crash or the OOM killer does:
// no shutdown handler runs, whatever it was doing is cut off.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	if !p.running() {
		return
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL %s: %v", p.name, err)
	}
	<-p.done
}

// resume continues a paused process.
func (p *proc) resume(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT %s: %v", p.name, err)
	}
}

// timed runs a request and reports how long the answer took.
func timed(t testing.TB, method, url string, body []byte, header map[string]string) (response, time.Duration) {
	t.Helper()
	start := time.Now()
	r := do(t, method, url, body, header)
	return r, time.Since(start)
}

// mustUnavailable checks that r is the gateway's retryable 503
// upstream_unavailable with Retry-After, answered within the deadline.
func mustUnavailable(t *testing.T, r response, took, deadline time.Duration) {
	t.Helper()
	mustStatus(t, r, http.StatusServiceUnavailable)
	e := decode[apierr.Error](t, r)
	if e.Code != apierr.CodeUpstreamUnavailable || !e.Retryable || e.Charged || e.RetryAfter <= 0 {
		t.Fatalf("error %+v", e)
	}
	if r.header.Get("Retry-After") != strconv.Itoa(e.RetryAfter) {
		t.Fatalf("Retry-After header %q, body retry_after %d", r.header.Get("Retry-After"), e.RetryAfter)
	}
	if took > deadline+deadlineMargin {
		t.Fatalf("the 503 took %v, over the %v deadline plus %v", took, deadline, deadlineMargin)
	}
}

// usdc reads who's test USDC balance on the stack's devnet.
func usdc(t testing.TB, s *stack, asset string, who common.Address) *big.Int {
	t.Helper()
	return usdcAt(t, "http://"+s.devnetRPC, asset, who)
}

func usdcAt(t testing.TB, rpcURL, asset string, who common.Address) *big.Int {
	t.Helper()
	c, err := ethclient.Dial(rpcURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	token := common.HexToAddress(asset)
	data := append(common.FromHex("0x70a08231"), common.LeftPadBytes(who.Bytes(), 32)...)
	// At the block that holds every settlement reported so far, not at
	// "latest", which can lag a receipt already readable.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	head, err := evmfacilitator.SettledHead(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.CallContract(ctx, ethereum.CallMsg{To: &token, Data: data}, head)
	if err != nil {
		t.Fatalf("balanceOf: %v", err)
	}
	return new(big.Int).SetBytes(out)
}

// offer reads the 402 offer of a verification route (a POST with no body is
// the x402 discovery probe).
func offer(t *testing.T, s *stack) (x402.PaymentRequirements, x402.Resource) {
	t.Helper()
	return offerAt(t, s.base())
}

func offerAt(t *testing.T, base string) (x402.PaymentRequirements, x402.Resource) {
	t.Helper()
	r := do(t, http.MethodPost, base+"/verify/schema", nil, nil)
	mustStatus(t, r, http.StatusPaymentRequired)
	var pr x402.PaymentRequired
	if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentRequired), &pr); err != nil || len(pr.Accepts) == 0 {
		t.Fatalf("PAYMENT-REQUIRED (%v): %+v", err, pr)
	}
	return pr.Accepts[0], pr.Resource
}

// A stalled verifierd (SIGSTOP: it accepts connections and never answers)
// becomes a 503 upstream_unavailable within the configured deadline, for
// free, paid and unpriced routes; the free call is not counted, the buyer is
// not charged, and the same payment settles once verifierd is back.
func TestStalledVerifierd(t *testing.T) {
	s := faultStack(t, "AOV_FREE_PER_DAY=3")
	body := example(t, "invoice-fixed.json")
	payer := evmfacilitator.DevAccounts()[2]
	req, resource := offer(t, s)
	payment, err := x402.SignExactEVM(payer.Key(), req, &resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, err := x402.EncodeHeader(payment)
	if err != nil {
		t.Fatal(err)
	}
	before := usdc(t, s, req.Asset, payer.Address)

	s.verifierd.pause(t)
	t.Run("a free verification is 503 within the deadline", func(t *testing.T) {
		r, took := timed(t, http.MethodPost, s.url("/verify/schema"), body, nil)
		mustUnavailable(t, r, took, testUpstreamTimeout)
	})
	t.Run("an unpriced route (/health) is 503 within the deadline", func(t *testing.T) {
		r, took := timed(t, http.MethodGet, s.url("/health"), nil, nil)
		mustUnavailable(t, r, took, testUpstreamTimeout)
	})
	t.Run("a paid verification is 503 within the deadline and nothing is charged", func(t *testing.T) {
		r, took := timed(t, http.MethodPost, s.url("/verify/schema"), body, map[string]string{x402.HeaderPaymentSignature: sig})
		mustUnavailable(t, r, took, testUpstreamTimeout)
		if r.header.Get(x402.HeaderPaymentResponse) != "" {
			t.Fatal("a 503 carries PAYMENT-RESPONSE")
		}
		if after := usdc(t, s, req.Asset, payer.Address); after.Cmp(before) != 0 {
			t.Fatalf("the payer's balance went from %v to %v", before, after)
		}
	})
	s.verifierd.resume(t)

	t.Run("verifierd back: the refused free call was not counted", func(t *testing.T) {
		r := post(t, s.url("/verify/schema"), body)
		mustStatus(t, r, http.StatusOK)
		if got := r.header.Get("Free-Allowance-Remaining"); got != "2" {
			t.Fatalf("Free-Allowance-Remaining %q after the first served free call of 3", got)
		}
	})
	t.Run("verifierd back: the same payment is accepted and settled once", func(t *testing.T) {
		r := do(t, http.MethodPost, s.url("/verify/schema"), body, map[string]string{x402.HeaderPaymentSignature: sig})
		mustStatus(t, r, http.StatusOK)
		var settle x402.SettleResponse
		if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentResponse), &settle); err != nil || !settle.Success {
			t.Fatalf("PAYMENT-RESPONSE (%v): %+v", err, settle)
		}
		paid := new(big.Int).Sub(before, usdc(t, s, req.Asset, payer.Address))
		if paid.String() != req.Amount {
			t.Fatalf("the payer paid %v, want %s", paid, req.Amount)
		}
	})
}

// A stalled certd makes verifierd's signing call time out: the verification
// is a retryable 503 within verifierd's signer deadline, not a hang, and
// serves again once certd continues.
func TestStalledCertd(t *testing.T) {
	s := faultStack(t)
	body := example(t, "invoice-fixed.json")
	s.certd.pause(t)
	t.Run("a verification is 503 within the signer deadline", func(t *testing.T) {
		r, took := timed(t, http.MethodPost, s.url("/verify/schema"), body, nil)
		mustUnavailable(t, r, took, 5*time.Second) // verifierd's -signer-timeout default
	})
	t.Run("the agent card (proxied to certd) is 503 within the deadline", func(t *testing.T) {
		r, took := timed(t, http.MethodGet, s.cardURL(), nil, nil)
		mustUnavailable(t, r, took, testUpstreamTimeout)
	})
	s.certd.resume(t)
	t.Run("certd back: the verification is served", func(t *testing.T) {
		mustStatus(t, post(t, s.url("/verify/schema"), body), http.StatusOK)
	})
}

// A client that trickles its body (one byte a second here; an attacker's
// one byte every five seconds is slower still) is cut at the server's
// read_body timeout instead of holding the connection open.
func TestSlowClientIsCut(t *testing.T) {
	s := faultStack(t)
	conn, err := net.Dial("tcp", s.caddyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /verify/schema HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n", s.caddyAddr)
	closed := make(chan time.Duration, 1)
	go func() {
		// Read whatever the server sends (an error answer, or nothing)
		// until it closes the connection.
		_, _ = io.Copy(io.Discard, bufio.NewReader(conn))
		closed <- time.Since(start)
	}()
	limit := testReadBodyTimeout + deadlineMargin
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case took := <-closed:
			if took < testReadBodyTimeout-time.Second {
				t.Fatalf("the connection closed after %v, before the %v read_body timeout", took, testReadBodyTimeout)
			}
			return
		case <-tick.C:
			if time.Since(start) > limit {
				t.Fatalf("a body trickled at one byte a second was still being read after %v (read_body %v)", time.Since(start), testReadBodyTimeout)
			}
			_, _ = conn.Write([]byte{' '})
		}
	}
}
