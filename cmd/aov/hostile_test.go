package main

import (
	"bytes"
	"crypto/ed25519"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// noControl fails when out carries a character that could steer a
// terminal (the C0 and C1 controls, DEL); newlines end lines.
func noControl(t *testing.T, out string) {
	t.Helper()
	if strings.ContainsFunc(out, func(r rune) bool { return r != '\n' && (r < ' ' || (r >= 0x7f && r <= 0x9f)) }) {
		t.Errorf("the output carries a control character: %q", out)
	}
}

// A hostile card's keyVersion strings reach the "the keys given are ..."
// list of an unknown key version: each is quoted, escapes and all.
func TestReceiptVerifyQuotesTheCardsKeyVersions(t *testing.T) {
	pub, _ := key(1)
	_, priv2 := key(2)
	evil := "\x1b]0;owned\x07\x1b[2J\u009b"
	c := card(map[string]ed25519.PublicKey{evil: pub}, evil)
	dir := t.TempDir()
	cf := writeFile(t, dir, "card.json", c)
	rf := writeFile(t, dir, "r.json", signedReceipt(t, invoiceRequest, priv2, "k9"))
	var stdout, stderr bytes.Buffer
	code := run([]string{"receipt", "verify", "--card", cf, rf}, nil, &stdout, &stderr)
	if want := "invalid: no public key for key_version k9 (the keys given are \"\\x1b]0;owned\\a\\x1b[2J\\u009b\")\n"; code != exitInvalid || stdout.String() != want {
		t.Errorf("exit %d, stdout %q; want %d, %q", code, stdout.String(), exitInvalid, want)
	}
	noControl(t, stdout.String()+stderr.String())
}

// A card server's reason phrase is its own text: only the status code is
// printed.
func TestReceiptVerifyPrintsOnlyTheStatusCodeOfACardServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			c.Read(buf)
			c.Write([]byte("HTTP/1.1 404 \x1b]0;owned\x07\x1b[2J\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			c.Close()
		}
	}()
	_, priv := key(2)
	rf := writeFile(t, t.TempDir(), "r.json", signedReceipt(t, invoiceRequest, priv, "k1"))
	url := "http://" + ln.Addr().String() + "/card"
	var stdout, stderr bytes.Buffer
	code := run([]string{"receipt", "verify", "--card", url, rf}, nil, &stdout, &stderr)
	if want := "error: loading the agent card: " + url + " answered HTTP 404\n"; code != exitTrouble || stderr.String() != want {
		t.Errorf("exit %d, stderr %q; want %d, %q", code, stderr.String(), exitTrouble, want)
	}
	noControl(t, stdout.String()+stderr.String())
}

// A card requested over https is never taken from a plain-http redirect
// target, where a network attacker would supply the keys (here the
// receipt's own, so the forged receipt would verify); a redirect that
// stays on https is followed.
func TestReceiptVerifyRefusesARedirectFromHTTPSToHTTP(t *testing.T) {
	pub, priv := key(1)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(card(map[string]ed25519.PublicKey{"k1": pub}, "k1"))
	}))
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/downgrade":
			http.Redirect(w, r, plain.URL+"/card", http.StatusFound)
		case "/moved":
			http.Redirect(w, r, "/card", http.StatusMovedPermanently)
		default:
			w.Write(card(map[string]ed25519.PublicKey{"k1": pub}, "k1"))
		}
	}))
	defer tlsSrv.Close()
	old := httpClient
	httpClient = tlsSrv.Client()
	httpClient.Timeout = cardTimeout
	defer func() { httpClient = old }()
	rf := writeFile(t, t.TempDir(), "r.json", signedReceipt(t, invoiceRequest, priv, "k1"))

	var stdout, stderr bytes.Buffer
	code := run([]string{"receipt", "verify", "--card", tlsSrv.URL + "/downgrade", rf}, nil, &stdout, &stderr)
	if code != exitTrouble || stdout.Len() != 0 || !strings.Contains(stderr.String(), "refusing the redirect to "+plain.URL+": a card requested over https is never fetched over http") {
		t.Errorf("https→http redirect: exit %d, stdout %q, stderr %q; want a refusal", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"receipt", "verify", "--card", tlsSrv.URL + "/moved", rf}, nil, &stdout, &stderr); code != exitValid {
		t.Errorf("https→https redirect: exit %d, stdout %q, stderr %q; want valid", code, stdout.String(), stderr.String())
	}
}

// --key-file reads a regular file of at most 4 KiB: a larger file or a
// FIFO (which would block) is refused without echoing anything of it; a
// file others can read works, with a warning naming the fix.
func TestWalletAuthKeyFileIsBoundedAndChecked(t *testing.T) {
	dir := t.TempDir()
	args := func(file string) []string {
		return []string{"wallet-auth", "--key-file", file, "--method", "GET", "--url", "https://x.example/"}
	}
	big := writeFile(t, dir, "big.hex", []byte(walletKeyHex+strings.Repeat(" SECRETISH", 500)))
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{big, "larger than 4096 bytes"},
		{fifo, "is not a regular file"},
		{dir, "is not a regular file"},
	} {
		for _, chain := range []string{"eip155:8453", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"} {
			var stdout, stderr bytes.Buffer
			code := run(append(args(tc.file), "--chain", chain), nil, &stdout, &stderr)
			if code != exitTrouble || stdout.Len() != 0 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("%s on %s: exit %d, stdout %q, stderr %q; want a refusal saying %q", filepath.Base(tc.file), chain, code, stdout.String(), stderr.String(), tc.want)
			}
			if strings.Contains(stderr.String(), "SECRETISH") || strings.Contains(stderr.String(), walletKeyHex) {
				t.Errorf("%s on %s: the key material was echoed", filepath.Base(tc.file), chain)
			}
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o644} {
		f := writeFile(t, dir, "wallet.hex", []byte(walletKeyHex+"\n"))
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		if code := run(args(f), nil, &stdout, &stderr); code != exitValid || stdout.Len() == 0 {
			t.Fatalf("mode %04o: exit %d, stderr %q", mode, code, stderr.String())
		}
		warned := strings.Contains(stderr.String(), "warning: the key file "+f+" has mode 0644") && strings.Contains(stderr.String(), "chmod 600 "+f)
		if warned != (mode == 0o644) {
			t.Errorf("mode %04o: stderr %q", mode, stderr.String())
		}
	}
}

// A card URL's user information (a token given as the user name, or a
// password) is printed in no error, even one net/http makes: nothing
// listening, or a redirect that fails. (Before: the token was printed as
// given.)
func TestReceiptVerifyPrintsNoUserInfoOfTheCardURL(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://ghp_REDIRECTTOKEN@"+closed+"/moved", http.StatusFound)
	}))
	defer redirect.Close()
	_, priv := key(1)
	rf := writeFile(t, t.TempDir(), "r.json", signedReceipt(t, invoiceRequest, priv, "k1"))
	for _, tc := range []struct{ cardURL, named string }{
		{"http://ghp_SECRETTOKEN@" + closed + "/card", "http://" + closed + "/card"},
		{"http://reader:ghp_SECRETTOKEN@" + closed + "/card", "http://" + closed + "/card"},
		{strings.Replace(redirect.URL, "http://", "http://ghp_SECRETTOKEN@", 1) + "/card", "http://" + closed + "/moved"},
	} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"receipt", "verify", "--card", tc.cardURL, rf}, nil, &stdout, &stderr)
		if code != exitTrouble || stdout.Len() != 0 || !strings.HasPrefix(stderr.String(), "error: loading the agent card: ") || !strings.Contains(stderr.String(), tc.named) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d and an error naming %s", tc.cardURL, code, stdout.String(), stderr.String(), exitTrouble, tc.named)
		}
		if out := stdout.String() + stderr.String(); strings.Contains(out, "ghp_") || strings.Contains(out, "reader") || strings.Contains(out, "***") {
			t.Errorf("%s: the output carries the URL's user information: %q", tc.cardURL, out)
		}
	}
}
