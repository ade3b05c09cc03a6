package x402

// DefaultDevnetAsset is the devnet's test USDC where every fresh devnet
// deploys it (the first contract of development account 0), known before
// any devnet runs in this process: a gateway whose devnet facilitator runs
// as its own process prices devnet routes with it. A devnet started here
// registers its own token (RegisterAsset), which replaces this one.
var DefaultDevnetAsset = Asset{Network: NetworkDevnet, Address: "0x5FbDB2315678afecb367f032d93F642f64180aa3", Name: "USD Coin", Version: "2", Decimals: 6}

func init() {
	assetsMu.Lock()
	if _, ok := assets[NetworkDevnet]; !ok {
		assets[NetworkDevnet] = DefaultDevnetAsset
	}
	assetsMu.Unlock()
}
