package agentcard

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/signer"
)

// pausingHandler is a slog handler that, the first time a record with
// message msg goes through it, signals entered and waits for release.
// certd's signing path logs "signing" right after it has chosen the key and
// before it signs: pausing there makes the gap between the two, which every
// signature has, as wide as a test needs.
type pausingHandler struct {
	msg     string
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (h *pausingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *pausingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() {
			close(h.entered)
			<-h.release
		})
	}
	return nil
}
func (h *pausingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *pausingHandler) WithGroup(string) slog.Handler      { return h }

// A rotation dated 10 min in certd's past (`certd rotate` on a host whose
// clock is behind) reaches certd while a signature with k1 is in flight:
// the key chosen, not signed yet. The reload an anonymous card request
// makes then must know of that signature and refuse the retirement, or
// certd delivers a k1 receipt dated 10 min after k1's retired_at, which
// its own card refuses.
func TestASignatureInFlightKeepsItsKeyFromARetirementBeforeIt(t *testing.T) {
	dir := t.TempDir()
	certdClock := &clock{t: time.Now().UTC().Truncate(time.Microsecond)}
	operator := &clock{t: certdClock.t.Add(-time.Hour)}
	ks, err := keystore.Open(dir, keystore.Options{Now: operator.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Generate(); err != nil {
		t.Fatal(err)
	}
	keys, err := keystore.Open(dir, keystore.Options{Watch: true, CurrentOnly: true, Now: certdClock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	ph := &pausingHandler{msg: "signing", entered: make(chan struct{}), release: make(chan struct{})}
	srv, err := signer.NewServer(signer.ServerConfig{Keys: keys, Now: certdClock.Now, Logger: slog.New(ph)})
	if err != nil {
		t.Fatal(err)
	}
	card, err := NewHandler(cfg, keys, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// The index rewritten unchanged (as any tool saving it does) makes the
	// signing path reload, so it logs "signing" with the key it chose.
	idx := filepath.Join(dir, keystore.IndexFile)
	data, err := os.ReadFile(idx)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(idx+".tmp", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(idx+".tmp", idx); err != nil {
		t.Fatal(err)
	}

	type result struct {
		code       int
		body, full []byte
	}
	done := make(chan result, 1)
	go func() {
		code, body, full := signAt(t, srv, "k1", certdClock.t)
		done <- result{code, body, full}
	}()
	select {
	case <-ph.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the signing path never chose a key")
	}
	operator.t = certdClock.t.Add(-10 * time.Minute)
	if _, err := ks.Rotate(); err != nil {
		t.Fatal(err)
	}
	servedKeys(t, card) // reloads the rotation
	close(ph.release)
	r := <-done
	if r.code != http.StatusOK {
		t.Fatalf("the signature in flight: %d %s", r.code, r.body)
	}
	if err := receipt.VerifyReceipt(r.full, servedKeys(t, card), receipt.ContextVerify); err != nil {
		t.Fatalf("certd delivered a k1 receipt dated %s that its own card refuses: %v", certdClock.t.Format(time.RFC3339Nano), err)
	}
}

// The same race without any pause: a large signing input in flight while
// the rotation lands and anonymous card requests reload it. No receipt
// certd delivers may be one its own card refuses.
func TestSignaturesInFlightDuringARetirementBeforeThemVerify(t *testing.T) {
	const trials = 30
	pad := strings.Repeat("x", 3<<20+512<<10)
	for trial := range trials {
		dir := t.TempDir()
		certdClock := &clock{t: time.Now().UTC().Truncate(time.Microsecond)}
		operator := &clock{t: certdClock.t.Add(-time.Hour)}
		ks, err := keystore.Open(dir, keystore.Options{Now: operator.Now})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ks.Generate(); err != nil {
			t.Fatal(err)
		}
		keys, err := keystore.Open(dir, keystore.Options{Watch: true, CurrentOnly: true, Now: certdClock.Now})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := signer.NewServer(signer.ServerConfig{Keys: keys, Now: certdClock.Now})
		if err != nil {
			t.Fatal(err)
		}
		card, err := NewHandler(cfg, keys, 0, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		at := certdClock.t.Format("2006-01-02T15:04:05.000000+00:00")
		resp := []byte(`{"pad":"` + pad + `","result":"pass","verified_at":"` + at + `","verify":{"key_version":"k1"}}`)
		body, err := receipt.SigningInput(receipt.ContextVerify, "k1", at, resp)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan []byte, 1)
		go func() {
			req := httptest.NewRequest(http.MethodPost, signer.PathSign, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			srv.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				done <- nil
				return
			}
			done <- rec.Body.Bytes()
		}()
		time.Sleep(time.Duration(trial%10) * 3 * time.Millisecond)
		operator.t = certdClock.t.Add(-10 * time.Minute)
		if _, err := ks.Rotate(); err != nil {
			t.Fatal(err)
		}
		var att []byte
	wait:
		for {
			servedKeys(t, card)
			select {
			case att = <-done:
				break wait
			default:
			}
		}
		if att != nil {
			var doc map[string]any
			if err := json.Unmarshal(resp, &doc); err != nil {
				t.Fatal(err)
			}
			doc["attestation"] = json.RawMessage(att)
			full, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			if err := receipt.VerifyReceipt(full, servedKeys(t, card), receipt.ContextVerify); err != nil {
				t.Fatalf("trial %d: certd delivered a receipt its own card refuses: %v", trial, err)
			}
		}
		keys.Close()
	}
}
