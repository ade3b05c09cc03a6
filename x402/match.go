package x402

// Match finds the server's offer that a client's accepted requirements
// select, and returns the server's copy: that is what gets verified and
// settled, so nothing the client changed outside the compared members
// (maxTimeoutSeconds, extra) can reach the facilitator.
//
// Compared, as the reference Go server does: scheme (exact), network
// (exact CAIP-2 string: both sides are canonical, see ValidCAIP2), amount
// (exact string; both must be canonical decimal integers, so "020000" never
// matches "20000": one amount has one spelling), asset and payTo (EVM
// addresses case-insensitively, because checksum case is presentation; other
// chains' addresses exactly). The first matching offer wins.
func Match(accepted PaymentRequirements, offers []PaymentRequirements) (PaymentRequirements, bool) {
	if i := MatchIndex(accepted, offers); i >= 0 {
		return offers[i], true
	}
	return PaymentRequirements{}, false
}

// MatchIndex is Match returning the index of the offer in offers, -1 when
// none matches, for a caller that keeps something per offer.
func MatchIndex(accepted PaymentRequirements, offers []PaymentRequirements) int {
	for i, o := range offers {
		if Mismatch(accepted, o) == "" {
			return i
		}
	}
	return -1
}

// Mismatch names the first member ("scheme", "network", "amount", "asset",
// "payTo") on which accepted fails to select offer, or "" when it matches.
// It lets logs say why a payment matched nothing.
func Mismatch(accepted, offer PaymentRequirements) string {
	switch {
	case accepted.Scheme != offer.Scheme:
		return "scheme"
	case accepted.Network != offer.Network || !ValidCAIP2(offer.Network):
		return "network"
	case accepted.Amount != offer.Amount || !canonicalUint(offer.Amount):
		return "amount"
	case !sameAddress(offer.Network, accepted.Asset, offer.Asset):
		return "asset"
	case !sameAddress(offer.Network, accepted.PayTo, offer.PayTo):
		return "payTo"
	}
	return ""
}

// SameAsset reports whether two offers sell for one asset: the same scheme,
// network and asset (compared as Match compares them). A buyer shown both
// pays whichever is cheaper, so a server offers each asset once.
func SameAsset(a, b PaymentRequirements) bool {
	return a.Scheme == b.Scheme && a.Network == b.Network && sameAddress(a.Network, a.Asset, b.Asset)
}
