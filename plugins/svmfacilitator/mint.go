package svmfacilitator

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"

	"github.com/aovhq/aov/x402"
)

// Token-2022 mints whose transfers the amount check cannot vouch for.
//
// A TransferChecked moves the instruction's amount out of the source, but
// with the TransferFeeConfig extension the destination receives the amount
// less a fee the mint withholds, and with TransferHook every transfer runs
// a program the issuer chooses. The fee and the hook program are the
// issuer's to change at any time (a fee raise takes effect two epochs
// later), so a fee of zero or an empty hook today vouches for nothing: the
// extension itself is refused. Extensions are fixed when a mint is
// initialized, so what a mint carries is read once and remembered; but a
// mint with the MintCloseAuthority extension can be closed (at supply 0)
// and initialized again at the same address with other extensions, so a
// clean verdict for one is not remembered: it is read for every payment.

// Token-2022 extension types (spl-token-2022's ExtensionType).
const (
	extUninitialized     = 0
	extTransferFeeConfig = 1
	extMintCloseAuth     = 3
	extTransferHook      = 14
)

// Token-2022 account layout: the base mint, padding to the length of a
// base token account, the account type, then type-length-value entries.
const (
	mintLen         = 82
	tokenAccountLen = 165
	accountTypeMint = 1
)

// maxMints bounds the mints whose verdict is remembered: the asset is the
// caller's to name, so a caller could otherwise grow the map at will. Past
// it, a mint is read for every payment.
const maxMints = 1024

// mintRefusal is why a payment in a Token-2022 mint with this account
// data is refused ("" for none), and whether the mint can be closed (and
// so initialized again with other extensions); ok is false when the data
// is not a mint as Token-2022 lays it out (the chain then refuses the
// transfer itself).
func mintRefusal(data []byte) (why string, closable, ok bool) {
	switch {
	case len(data) == mintLen:
		return "", false, true // no extensions
	case len(data) <= tokenAccountLen || data[tokenAccountLen] != accountTypeMint:
		return "", false, false
	}
	for _, b := range data[mintLen:tokenAccountLen] {
		if b != 0 {
			return "", false, false
		}
	}
	fee, hook := false, false
	for rest := data[tokenAccountLen+1:]; len(rest) >= 4; {
		typ, n := binary.LittleEndian.Uint16(rest), int(binary.LittleEndian.Uint16(rest[2:]))
		if typ == extUninitialized {
			break
		}
		if len(rest) < 4+n {
			return "", false, false
		}
		fee = fee || typ == extTransferFeeConfig
		hook = hook || typ == extTransferHook
		closable = closable || typ == extMintCloseAuth
		rest = rest[4+n:]
	}
	switch {
	case fee:
		return "the asset is a Token-2022 mint with a transfer fee: the payee would receive less than the amount", closable, true
	case hook:
		return "the asset is a Token-2022 mint with a transfer hook: its issuer's program runs on every transfer", closable, true
	}
	return "", closable, true
}

// checkMint refuses c when its transfer is of a Token-2022 mint with a
// transfer fee or a transfer hook (mintRefusal). It reads the mint once
// per mint; a mint that is missing, not Token-2022's or not laid out as a
// mint gets no verdict here (the simulation refuses its transfer) and is
// read again next time. An error means the chain could not be asked.
func (f *Facilitator) checkMint(ctx context.Context, c *checked) error {
	if c.program != Token2022Program {
		return nil
	}
	f.mu.Lock()
	why, known := f.mints[c.mint]
	f.mu.Unlock()
	if !known {
		acc, err := f.rpc.AccountInfo(ctx, c.mint.String())
		if err != nil {
			return fmt.Errorf("reading the mint: %w", err)
		}
		if acc == nil || acc.Owner != Token2022Program.String() || len(acc.Data) != 2 || acc.Data[1] != "base64" {
			return nil
		}
		data, err := base64.StdEncoding.Strict().DecodeString(acc.Data[0])
		if err != nil {
			return nil
		}
		var closable, ok bool
		if why, closable, ok = mintRefusal(data); !ok {
			return nil
		}
		// A closable mint's verdict is not kept: it may be another mint
		// next time (a refusal would only refuse a mint that no longer
		// deserves it, but one rule is simpler to trust).
		f.mu.Lock()
		if len(f.mints) < maxMints && !closable {
			f.mints[c.mint] = why
		}
		f.mu.Unlock()
	}
	if why != "" {
		c.resp = refuse(x402.ReasonInvalidPaymentRequirements, c.payer, why).resp
	}
	return nil
}
