// Regenerates base.json and base-sepolia.json: PAYMENT-SIGNATURE headers made
// by the official x402 TypeScript client, used as interop vectors and fuzz
// seeds by the x402 package tests. The key is a well-known public test key.
//
//   npm install @x402/core@2.27.0 @x402/evm@2.27.0 viem
//   node gen.mjs eip155:84532   # prints {address, header, payload}
//   node gen.mjs eip155:8453
import { x402Client, x402HTTPClient } from "@x402/core/client";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { privateKeyToAccount } from "viem/accounts";

const account = privateKeyToAccount("0x4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318");
const client = new x402Client();
registerExactEvmScheme(client, { signer: account });
if (client.setSpendControls) client.setSpendControls(false);
const network = process.argv[2] || "eip155:84532";
const asset = network === "eip155:8453" ? "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913" : "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
const name = network === "eip155:8453" ? "USD Coin" : "USDC";
const paymentRequired = {
  x402Version: 2,
  error: "Payment required",
  resource: { url: "https://api.example/verify/schema", description: "Verify a JSON output", mimeType: "application/json" },
  accepts: [{ scheme: "exact", network, amount: "20000", asset, payTo: "0x209693bc6afc0c5328ba36faf03c514ef312287c", maxTimeoutSeconds: 300, extra: { name, version: "2" } }],
};
const http = new x402HTTPClient(client);
const payload = await http.createPaymentPayload(paymentRequired);
const headers = http.encodePaymentSignatureHeader(payload);
console.log(JSON.stringify({ address: account.address, header: headers["PAYMENT-SIGNATURE"], payload }));
