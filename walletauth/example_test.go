package walletauth_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/walletauth"
)

// A client signs a header for one request; the gateway verifies it against
// the request it arrived with.
func Example() {
	key, _ := crypto.HexToECDSA("4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318")
	header, err := walletauth.SignRequest(key, walletauth.Request{
		Method:  "POST",
		URL:     "https://verifier.example/verify/schema",
		AgentID: "seller-7",
		TTL:     time.Minute,
	})
	if err != nil {
		panic(err)
	}

	// In the gateway, Nonces is the shared claim store; without it a
	// verifier does not refuse replays.
	v := &walletauth.Verifier{}
	proof, err := v.Verify(context.Background(), header, walletauth.Expect{
		Domain: "verifier.example", Method: "POST", Path: "/verify/schema",
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(proof.Address.Hex(), proof.AgentID)

	// The same header is refused for another path.
	_, err = v.Verify(context.Background(), header, walletauth.Expect{
		Domain: "verifier.example", Method: "POST", Path: "/score/seller-7",
	})
	fmt.Println(err)
	// Output:
	// 0x2c7536E3605D9C16a7a3D7b1898e529396a65c23 seller-7
	// X-Wallet-Auth path is not the request's path
}
