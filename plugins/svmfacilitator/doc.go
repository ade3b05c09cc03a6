// Package svmfacilitator is a local x402 facilitator for the "exact" scheme
// on Solana: SPL Token and Token-2022 TransferChecked payments, paid for by
// a fee-payer key the facilitator holds.
//
// Facilitator verifies a client's partially signed transaction with the
// reference TypeScript facilitator's checks and reason codes (instruction
// layout, compute price, mint, destination associated token account, exact
// amount, memo, simulation) plus the ones it lacks: a cap on the compute
// unit limit (the price cap alone lets a payment cost the fee payer about
// 0.007 SOL), the fee payer in no instruction at all, and small-order
// public keys refused before signatures are checked (crypto/ed25519
// accepts a forged signature from one). Settlements that pass simulation
// and then fail on chain still cost the fee payer its fee, so they are
// budgeted per payer and overall (budget.go): a payer past its budget, or
// a payment asking for more than a small priority fee once the overall
// budget is used, is refused before anything is sent. It settles by
// co-signing the fee payer's slot, sending, and polling the signature's
// status under a deadline; an outcome it cannot establish is reported as unknown, never
// as a failure. It resolves such an outcome later from the chain, also
// after a restart (the transaction's id is its own deterministic
// signature), and StatusReader does so for a remote facilitator from the
// chain endpoint alone, finding the payment's transaction by its message
// when nothing named it (status_search.go), and taking one that landed as
// the asking attempt's only if it landed after that attempt began
// (attempt.go).
//
// The transaction decoder is small and on the standard library (plus
// filippo.io/edwards25519 for curve checks): a payment is one v0 or legacy
// transaction of a few hundred bytes, and co-signing writes 64 bytes into
// the client's wire bytes, so nothing is ever re-encoded.
package svmfacilitator
