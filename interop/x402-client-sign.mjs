// Signs an x402 payment with the official client (@x402/core + @x402/evm),
// as a buyer's agent would. Input on stdin: {"privateKey": "0x…",
// "paymentRequired": {…PaymentRequired…}}. Output on stdout:
// {"header": "<PAYMENT-SIGNATURE value>", "payload": {…PaymentPayload…}}.
import { x402Client, x402HTTPClient } from "@x402/core/client";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { privateKeyToAccount } from "viem/accounts";
import { readStdinJSON, fail } from "./lib.mjs";
import { registerSvm } from "./svm-lib.mjs";

try {
  const input = await readStdinJSON();
  const client = new x402Client();
  if (input.privateKey) registerExactEvmScheme(client, { signer: privateKeyToAccount(input.privateKey) });
  // {"solana": {"secretKey", "rpcUrl"}} signs on Solana instead (or too).
  if (input.solana) await registerSvm(client, input.solana);
  // The devnet token is unknown to the client's default allow-list.
  client.setSpendControls(false);
  const http = new x402HTTPClient(client);
  const payload = await http.createPaymentPayload(input.paymentRequired);
  const headers = http.encodePaymentSignatureHeader(payload);
  process.stdout.write(JSON.stringify({ header: headers["PAYMENT-SIGNATURE"], payload }) + "\n");
} catch (e) {
  fail(e);
}
