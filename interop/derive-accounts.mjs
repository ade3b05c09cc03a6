// Derives the ten development accounts from the public test mnemonic with
// viem (BIP-39/BIP-32, m/44'/60'/0'/0/i), so a Go test can check the keys the
// devnet hard-codes. Output: [{"address", "privateKey"}, …].
import { mnemonicToAccount } from "viem/accounts";
import { bytesToHex } from "viem";

const mnemonic = "test test test test test test test test test test test junk";
const out = [];
for (let i = 0; i < 10; i++) {
  const a = mnemonicToAccount(mnemonic, { addressIndex: i });
  out.push({ address: a.address, privateKey: bytesToHex(a.getHdKey().privateKey) });
}
process.stdout.write(JSON.stringify(out) + "\n");
