package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/pghistory"
	"github.com/aovhq/aov/store/storetest"
)

// TestSwitchToPostgresKeepsOwners: a verifierd moved from its Badger
// history in -data to -history postgres:// refuses to start while -data
// holds owners or records PostgreSQL lacks, naming copy-history; that
// command copies them (again and again without harm), after which the
// start succeeds and the owner of an agent id is the one -data recorded:
// another wallet cannot take the name. An owner PostgreSQL already gives
// to another wallet is never overwritten: both the copy and the start
// refuse.
func TestSwitchToPostgresKeepsOwners(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	const owner = "0x1111111111111111111111111111111111111111"
	const thief = "0x9999999999999999999999999999999999999999"
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

	h, err := openHistory(ctx, config{dataDir: dir}, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, agent := range []string{"seller-7", "contested"} {
		if o, err := h.(store.Owners).BindAgent(ctx, agent, owner); err != nil || o != owner {
			t.Fatalf("bind on Badger: %q %v", o, err)
		}
	}
	// More records than one page of the history, authenticated or not.
	for i := range 150 {
		v := storetest.Sample("v"+string(rune('A'+i/26))+string(rune('a'+i%26)), "seller-7", at.Add(time.Duration(i)*time.Second), "pass")
		if i%3 == 0 {
			v.Authenticated, v.Wallet = true, owner
		}
		if i%7 == 0 {
			v.AgentID = ""
		}
		if err := h.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	want, err := h.AgentCounts(ctx, "seller-7")
	if err != nil {
		t.Fatal(err)
	}
	h.Close()

	srv := servers.StartPostgres(t)
	pg := config{dataDir: dir, history: srv.DSN}
	if _, err := openHistory(ctx, pg, log); err == nil || !strings.Contains(err.Error(), "verifierd copy-history") {
		t.Fatalf("start on PostgreSQL with an uncopied -data = %v, want a refusal naming copy-history", err)
	}
	copyHistory := func() (string, error) {
		var out bytes.Buffer
		err := run(ctx, []string{"copy-history", "-data", dir, "-history", srv.DSN}, &out, nil)
		return out.String(), err
	}
	if out, err := copyHistory(); err != nil || !strings.Contains(out, `"owners":2`) || !strings.Contains(out, `"records":150`) {
		t.Fatalf("copy-history: %v\n%s", err, out)
	}
	if out, err := copyHistory(); err != nil || !strings.Contains(out, `"owners":0`) || !strings.Contains(out, `"records":0`) {
		t.Fatalf("copy-history again: %v\n%s", err, out)
	}
	h, err = openHistory(ctx, pg, log)
	if err != nil {
		t.Fatalf("start after copy-history: %v", err)
	}
	if o, err := h.(store.Owners).BindAgent(ctx, "seller-7", thief); err != nil || o != owner {
		t.Fatalf("after the switch another wallet's bind of seller-7 returns owner %q (%v), want %s", o, err, owner)
	}
	if c, err := h.AgentCounts(ctx, "seller-7"); err != nil || c != want {
		t.Fatalf("counts after the copy %+v (%v), want %+v", c, err, want)
	}
	auth, _, err := h.(*pghistory.History).AuthenticatedVerifications(ctx, "seller-7", "", 100)
	if err != nil || len(auth) != 42 {
		t.Fatalf("%d authenticated records after the copy (%v), want 42", len(auth), err)
	}
	all, _, err := h.Verifications(ctx, "", "", 100)
	if err != nil || len(all) != 100 {
		t.Fatalf("%d records on the first page (%v)", len(all), err)
	}
	h.Close()

	// An owner PostgreSQL gives to another wallet: refused, not overwritten.
	p, err := pghistory.Open(ctx, srv.DSN, pghistory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	b, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if o, err := b.BindAgent(ctx, "taken", owner); err != nil || o != owner {
		t.Fatal(o, err)
	}
	b.Close()
	if o, err := p.BindAgent(ctx, "taken", thief); err != nil || o != thief {
		t.Fatal(o, err)
	}
	if out, err := copyHistory(); err == nil || !strings.Contains(err.Error(), "1 agent id") {
		t.Fatalf("copy-history over another owner: %v\n%s", err, out)
	}
	if o, _ := p.AgentOwner(ctx, "taken"); o != thief {
		t.Fatalf("copy-history overwrote an owner with %q", o)
	}
	if _, err := openHistory(ctx, pg, log); err == nil || !strings.Contains(err.Error(), "1 agent id") {
		t.Fatalf("start with an owner conflict = %v, want a refusal", err)
	}

	// A -data that holds no history is neither refused nor created.
	none := filepath.Join(t.TempDir(), "none")
	h, err = openHistory(ctx, config{dataDir: none, history: srv.DSN}, log)
	if err != nil {
		t.Fatalf("start with an empty -data: %v", err)
	}
	h.Close()
	if _, err := os.Stat(none); !os.IsNotExist(err) {
		t.Fatalf("the start made -data: %v", err)
	}
}

// TestCopyHistoryLeavesAConflictedIDsRecords: an agent id -data gives to
// one wallet and PostgreSQL to another keeps PostgreSQL's owner, and none
// of -data's records of it are copied: they are the other wallet's
// history, and would count as the authenticated history of PostgreSQL's
// owner. The copy and the start both refuse naming the id, and the copy
// reports the records it left; the other ids are copied.
func TestCopyHistoryLeavesAConflictedIDsRecords(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	const walletA = "0x1111111111111111111111111111111111111111"
	const walletB = "0x9999999999999999999999999999999999999999"
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	b, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, agent := range []string{"contested", "quoted\"\n\x00id", "seller-7"} {
		if o, err := b.BindAgent(ctx, agent, walletA); err != nil || o != walletA {
			t.Fatal(o, err)
		}
	}
	for i := range 5 {
		v := storetest.Sample(fmt.Sprint("a-", i), "contested", at.Add(time.Duration(i)*time.Second), "pass")
		v.Authenticated, v.Wallet = true, walletA
		if err := b.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	v := storetest.Sample("mine", "seller-7", at, "pass")
	v.Authenticated, v.Wallet = true, walletA
	if err := b.RecordVerification(ctx, v); err != nil {
		t.Fatal(err)
	}
	b.Close()

	srv := servers.StartPostgres(t)
	p, err := pghistory.Open(ctx, srv.DSN, pghistory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, agent := range []string{"contested", "quoted\"\n\x00id"} {
		if o, err := p.BindAgent(ctx, agent, walletB); err != nil || o != walletB {
			t.Fatal(o, err)
		}
	}
	names := []string{`"contested"`, `"quoted\"\n\x00id"`}
	var out bytes.Buffer
	err = run(ctx, []string{"copy-history", "-data", dir, "-history", srv.DSN}, &out, nil)
	if err == nil || !strings.Contains(out.String(), `"skipped_records":5`) || !strings.Contains(out.String(), `"records":1`) {
		t.Fatalf("copy-history with conflicting owners: %v\n%s", err, out.String())
	}
	for _, name := range names {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("copy-history's refusal does not name %s: %v", name, err)
		}
	}
	if strings.ContainsAny(err.Error(), "\n\x00") {
		t.Errorf("copy-history's refusal holds an agent id's control characters: %q", err)
	}
	if _, err := openHistory(ctx, config{dataDir: dir, history: srv.DSN}, log); err == nil || !strings.Contains(err.Error(), names[0]) || !strings.Contains(err.Error(), names[1]) {
		t.Errorf("the start's refusal does not name the conflicting ids: %v", err)
	}
	c, err := p.AgentCounts(ctx, "contested")
	if err != nil {
		t.Fatal(err)
	}
	auth, _, err := p.AuthenticatedVerifications(ctx, "contested", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if c.Total() != 0 || len(auth) != 0 {
		t.Fatalf("%s's id holds %+v and %d authenticated records of -data's owner after the copy, want none", walletB, c, len(auth))
	}
	if c, err := p.AgentCounts(ctx, "seller-7"); err != nil || c.AuthenticatedPass != 1 {
		t.Fatalf("seller-7 after the copy: %+v %v", c, err)
	}
}

// TestCopyHistorySameEVMWalletInTwoCases: an EVM address is one wallet
// however it is cased (as verifierd compares owners), so an id -data and
// PostgreSQL give to it in two spellings is no conflict: the copy and the
// start succeed.
func TestCopyHistorySameEVMWalletInTwoCases(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.BindAgent(ctx, "my-agent", "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed"); err != nil {
		t.Fatal(err)
	}
	b.Close()
	srv := servers.StartPostgres(t)
	p, err := pghistory.Open(ctx, srv.DSN, pghistory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.BindAgent(ctx, "my-agent", "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"copy-history", "-data", dir, "-history", srv.DSN}, &out, nil); err != nil {
		t.Fatalf("copy-history of an id both histories give to one wallet: %v\n%s", err, out.String())
	}
	h, err := openHistory(ctx, config{dataDir: dir, history: srv.DSN}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	h.Close()
}

// TestCopyHistoryKeepsABareSolanaAccountItsKeyHolders: a bare Solana
// address S is, with no owner row, its account's (its key holder's) on a
// PostgreSQL history, and no new binding of one is made (SPEC §9). A
// -data holding a binding of S made before that rule by another wallet W
// is a conflict: the copy and the start refuse, naming S; S stays its key
// holder's, whose authenticated record still counts, and W's records of S
// are not copied. A binding of S to its own address is no conflict, nor is
// W's binding once PostgreSQL holds it (an operator inserted the row).
// (Before: the copy wrote W's binding as a missing owner, counted no
// conflict, and took S from its key holder.)
func TestCopyHistoryKeepsABareSolanaAccountItsKeyHolders(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	key := func(b byte) string {
		k := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, 32))
		return base58.Encode(k.Public().(ed25519.PublicKey))
	}
	S, own := key(7), key(8)
	for _, s := range []string{S, own} {
		if _, ok := store.SolanaWalletKey(s); !ok {
			t.Fatalf("precondition: %s must be a Solana wallet address", s)
		}
	}
	const W = "0x9999999999999999999999999999999999999999"

	b, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for agent, wallet := range map[string]string{S: W, own: own} {
		if o, err := b.BindAgent(ctx, agent, wallet); err != nil || o != wallet {
			t.Fatalf("bind %s on Badger: %q %v", agent, o, err)
		}
	}
	v := storetest.Sample("squatter-1", S, at, "fail")
	v.Authenticated, v.Wallet = true, W
	if err := b.RecordVerification(ctx, v); err != nil {
		t.Fatal(err)
	}
	b.Close()

	srv := servers.StartPostgres(t)
	p, err := pghistory.Open(ctx, srv.DSN, pghistory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	v = storetest.Sample("keyholder-1", S, at, "pass")
	v.Authenticated, v.Wallet = true, S
	if err := p.RecordVerification(ctx, v); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	err = run(ctx, []string{"copy-history", "-data", dir, "-history", srv.DSN}, &out, nil)
	if err == nil || !strings.Contains(err.Error(), strconv.Quote(S)) || strings.Contains(err.Error(), strconv.Quote(own)) ||
		!strings.Contains(out.String(), `"conflicts":1`) || !strings.Contains(out.String(), `"skipped_records":1`) {
		t.Errorf("copy-history: err %v, want refused naming %s (and not %s), 1 conflict, 1 record skipped\n%s", err, S, own, out.String())
	}
	if owner, err := p.AgentOwner(ctx, S); err != nil || owner != "" {
		t.Errorf("PostgreSQL owner of the bare Solana address after the copy: %q %v, want none (its key holder's account)", owner, err)
	}
	if c, err := p.AgentCounts(ctx, S); err != nil || c.Total() != 1 || c.AuthenticatedPass != 1 {
		t.Errorf("%s after the copy: %+v %v, want the key holder's one authenticated pass only", S, c, err)
	}
	if _, err := openHistory(ctx, config{dataDir: dir, history: srv.DSN}, log); err == nil || !strings.Contains(err.Error(), strconv.Quote(S)) {
		t.Errorf("the start's refusal does not name %s: %v", S, err)
	}

	// The operator gives S to W on PostgreSQL: the same binding is no
	// conflict, and the copy and the start succeed.
	if _, err := p.BindAgent(ctx, S, W); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(ctx, []string{"copy-history", "-data", dir, "-history", srv.DSN}, &out, nil); err != nil {
		t.Fatalf("copy-history with the same binding on PostgreSQL: %v\n%s", err, out.String())
	}
	h, err := openHistory(ctx, config{dataDir: dir, history: srv.DSN}, log)
	if err != nil {
		t.Fatalf("start with the same binding on PostgreSQL: %v", err)
	}
	h.Close()
}
