// A buyer's agent paying with the official fetch wrapper (@x402/fetch's
// wrapFetchWithPayment over @x402/core + @x402/evm): it sends the request,
// gets the 402, signs a payment and retries, as agents in the wild do.
// Input on stdin: {"privateKey": "0x…", "url": "…", "method": "POST",
// "body": "<string>", "headers": {…}}. Output on stdout: {"status": n,
// "body": "<string>", "paymentResponse": {…decoded PAYMENT-RESPONSE…} | null,
// "headers": {…}}.
import { x402Client } from "@x402/core/client";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { wrapFetchWithPayment, decodePaymentResponseHeader } from "@x402/fetch";
import { privateKeyToAccount } from "viem/accounts";
import { readStdinJSON, fail } from "./lib.mjs";
import { registerSvm } from "./svm-lib.mjs";

try {
  const input = await readStdinJSON();
  const client = new x402Client();
  if (input.privateKey) registerExactEvmScheme(client, { signer: privateKeyToAccount(input.privateKey) });
  // {"solana": {"secretKey", "rpcUrl"}} pays on Solana instead (or too).
  if (input.solana) await registerSvm(client, input.solana);
  // The devnet token is unknown to the client's default allow-list.
  client.setSpendControls(false);
  const fetchWithPayment = wrapFetchWithPayment(fetch, client);
  const res = await fetchWithPayment(input.url, {
    method: input.method || "GET",
    headers: { "Content-Type": "application/json", ...(input.headers || {}) },
    body: input.body,
  });
  const header = res.headers.get("PAYMENT-RESPONSE");
  const headers = {};
  res.headers.forEach((v, k) => (headers[k] = v));
  process.stdout.write(JSON.stringify({
    status: res.status,
    body: await res.text(),
    paymentResponse: header ? decodePaymentResponseHeader(header) : null,
    headers,
  }) + "\n");
} catch (e) {
  fail(e);
}
