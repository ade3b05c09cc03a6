package main

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/agentcard"
	"github.com/aovhq/aov/keystore"
)

// TestReceiptVerifyAgainstTheServedCard checks receipts against the card
// certd really serves, through a key rotation and a compromise mark: the
// agent card handler over a real key directory.
func TestReceiptVerifyAgainstTheServedCard(t *testing.T) {
	clock := at.Add(-48 * time.Hour)
	store, err := keystore.Open(t.TempDir(), keystore.Options{Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	k1, err := store.Generate()
	if err != nil {
		t.Fatal(err)
	}
	clock = at.Add(-24 * time.Hour)
	k2, err := store.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	h, err := agentcard.NewHandler(agentcard.Config{BaseURL: "https://verifier.example"}, store, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	cardURL := srv.URL + "/.well-known/agent-card.json"

	// r1 is dated while k1 was current; r1late after k1 was retired, which
	// certd never does: someone signed with a copy of the retired key.
	r1 := writeFile(t, t.TempDir(), "r1.json", signedReceiptAt(t, invoiceRequest, k1.Private, k1.Version, at.Add(-36*time.Hour)))
	r1late := writeFile(t, t.TempDir(), "r1late.json", signedReceipt(t, invoiceRequest, k1.Private, k1.Version))
	r2 := writeFile(t, t.TempDir(), "r2.json", signedReceipt(t, invoiceRequest, k2.Private, k2.Version))
	check := func(desc, file string, code int, out string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		got := run([]string{"receipt", "verify", "--card", cardURL, file}, nil, &stdout, &stderr)
		if got != code || !strings.HasPrefix(stdout.String(), out) {
			t.Errorf("%s: exit %d stdout %q stderr %q, want %d %q", desc, got, stdout.String(), stderr.String(), code, out)
		}
	}
	check("a receipt of the current key is valid", r2, 0, "valid\n")
	check("a receipt of the retired key stays valid", r1, 0, "valid\n")
	check("a receipt of the retired key dated after its retirement is invalid", r1late, 1, "invalid: key "+k1.Version+" was retired at")

	// k2 marked compromised from before the receipt was made: the card
	// now says so and the receipt no longer holds; k1's receipt still does.
	clock = at.Add(time.Hour)
	if _, err := store.MarkCompromised(k2.Version, at.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	check("a receipt of a key compromised before it was signed is invalid", r2, 1, "invalid: key "+k2.Version+" is marked compromised since")
	check("an older key's receipt is unaffected", r1, 0, "valid\n")
}
