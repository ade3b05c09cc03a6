package evmfacilitator

import (
	"bufio"
	"context"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
)

// With a data folder, the devnet's chain survives a restart: blocks,
// balances and nonces continue where they were, and a settled
// authorization stays used (it cannot settle a second time).
func TestDevnetStateSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	d, err := StartDevnet(DevnetConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	f, err := d.NewFacilitator()
	if err != nil {
		t.Fatal(err)
	}
	req := (&testEnv{d: d}).requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	if r, err := f.Settle(ctx, p, req); err != nil || !r.Success {
		t.Fatalf("settle: %+v, %v", r, err)
	}
	from := crypto.PubkeyToAddress(payer.PublicKey)
	balance := usdcBalance(t, d, from)
	relayerNonce, err := d.Client().NonceAt(ctx, crypto.PubkeyToAddress(DevKey(0).PublicKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	height, err := d.Client().BlockNumber(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	d2 := startDevnet(t, DevnetConfig{DataDir: dir})
	if d2.Token() != d.Token() {
		t.Fatalf("token moved from %s to %s", d.Token(), d2.Token())
	}
	if got := usdcBalance(t, d2, from); got.Cmp(balance) != 0 {
		t.Fatalf("payer balance %v after the restart, %v before", got, balance)
	}
	if got, err := d2.Client().NonceAt(ctx, crypto.PubkeyToAddress(DevKey(0).PublicKey), nil); err != nil || got != relayerNonce {
		t.Fatalf("relayer nonce %d (%v) after the restart, %d before", got, err, relayerNonce)
	}
	if got, err := d2.Client().BlockNumber(ctx); err != nil || got < height {
		t.Fatalf("block height %d (%v) after the restart, %d before", got, err, height)
	}
	f2, err := d2.NewFacilitator()
	if err != nil {
		t.Fatal(err)
	}
	if r, err := f2.Verify(ctx, p, req); err != nil || r.IsValid {
		t.Fatalf("the settled authorization verifies again after the restart: %+v, %v", r, err)
	}
	// And the chain goes on: a new payment settles.
	if r, err := f2.Settle(ctx, mustSignExact(t, payer, req), req); err != nil || !r.Success {
		t.Fatalf("settle after the restart: %+v, %v", r, err)
	}
	if got := usdcBalance(t, d2, from); new(big.Int).Sub(balance, got).String() != amount {
		t.Fatalf("balance %v after a second payment of %s from %v", got, amount, balance)
	}
}

// The crash case: a process that settled a payment on a devnet with a data
// folder is killed (SIGKILL, no chance to flush anything); the next devnet on
// that folder still has the payment on chain.
func TestDevnetStateSurvivesACrash(t *testing.T) {
	if dir := os.Getenv("AOV_TEST_DEVNET_CRASH_DIR"); dir != "" {
		// The child: settle one payment, say so, and wait to be killed.
		d, err := StartDevnet(DevnetConfig{DataDir: dir})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		f, _ := d.NewFacilitator()
		req := (&testEnv{d: d}).requirements(payee, amount)
		if r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req); err != nil || !r.Success {
			fmt.Println("error: settle:", r, err)
			os.Exit(1)
		}
		fmt.Printf("settled, balance %v\n", usdcBalance(t, d, crypto.PubkeyToAddress(payer.PublicKey)))
		time.Sleep(time.Minute)
		os.Exit(1)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDevnetStateSurvivesACrash$")
	cmd.Env = append(os.Environ(), "AOV_TEST_DEVNET_CRASH_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	var balance string
	if _, scanErr := fmt.Sscanf(line, "settled, balance %s", &balance); err != nil || scanErr != nil {
		t.Fatalf("child: %q (%v)", line, err)
	}

	d := startDevnet(t, DevnetConfig{DataDir: dir})
	if got := usdcBalance(t, d, crypto.PubkeyToAddress(payer.PublicKey)); got.String() != balance {
		t.Fatalf("payer balance %v after the crash, %s before", got, balance)
	}
}
