package x402

// withAssetExtra adds to each kind the network's registered USDC, so a
// server can price a route on that network from GET /supported alone: the
// official servers know the default asset of public networks only, and a
// devnet's token address exists only once the devnet deployed it. It adds
// "asset" and "decimals", and for EVM the EIP-712 "name" and "version" the
// payer signs for; members the facilitator set itself (a Solana fee payer)
// are kept.
func withAssetExtra(kinds []SupportedKind) []SupportedKind {
	out := make([]SupportedKind, len(kinds))
	for i, k := range kinds {
		out[i] = k
		a, ok := USDC(k.Network)
		if !ok {
			continue
		}
		extra := map[string]any{"asset": a.Address, "decimals": a.Decimals}
		for key, v := range a.Extra() {
			extra[key] = v
		}
		for key, v := range k.Extra {
			extra[key] = v
		}
		out[i].Extra = extra
	}
	return out
}
