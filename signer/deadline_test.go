package signer

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
)

// stalledListener accepts connections and never answers, as a certd stopped
// with SIGSTOP looks from outside (the kernel still completes the accept).
func stalledListener(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never read or answered
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln
}

// A certd that accepts and never answers makes every call a retryable 503
// within the client's timeout, even when the caller's context has no
// deadline.
func TestStalledSignerIsUnavailableWithinTheTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	sock := filepath.Join(shortDir(t), "stalled.sock")
	stalledListener(t, "unix", sock)
	tcp := stalledListener(t, "tcp", "127.0.0.1:0")
	for _, tc := range []struct {
		desc string
		cfg  ClientConfig
	}{
		{"over the unix socket", ClientConfig{Socket: sock, Timeout: timeout}},
		{"over loopback TCP", ClientConfig{URL: "http://" + tcp.Addr().String(), Secret: "x", Timeout: timeout}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c := NewClient(tc.cfg)
			start := time.Now()
			_, err := c.Sign(context.Background(), receipt.ContextVerify, "k1", nowString(), []byte(`{}`))
			took := time.Since(start)
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Code != apierr.CodeUpstreamUnavailable || !ae.Retryable {
				t.Fatalf("err = %v, want a retryable upstream_unavailable", err)
			}
			if took > timeout+2*time.Second {
				t.Fatalf("the call took %v with a %v timeout", took, timeout)
			}
		})
	}
}
