// A buyer's agent using MCP through the gateway, with the official MCP
// TypeScript SDK client (Client + StreamableHTTPClientTransport) and the
// official x402 client for payment (x402's MCP transport: the payment goes
// in the tool call's _meta["x402/payment"], the settlement comes back in the
// result's _meta["x402/payment-response"]).
// Input on stdin: {"url": "<base>/mcp", "privateKey": "0x…",
// "calls": [{"name": …, "arguments": {…}}, …]}. Each call is made once
// without payment; a payment-required result (isError with a PaymentRequired
// in structuredContent) is paid and the call made again.
// Output on stdout: {"tools": [names], "calls": [{"name", "first": {isError,
// code, demand}, "paid": {isError, structuredContent, paymentResponse} | null}]}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { x402Client, x402HTTPClient } from "@x402/core/client";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { privateKeyToAccount } from "viem/accounts";
import { readStdinJSON, fail } from "./lib.mjs";
import { registerSvm } from "./svm-lib.mjs";

try {
  const input = await readStdinJSON();
  const payer = new x402Client();
  if (input.privateKey) registerExactEvmScheme(payer, { signer: privateKeyToAccount(input.privateKey) });
  // {"solana": {"secretKey", "rpcUrl"}} pays on Solana instead (or too).
  if (input.solana) await registerSvm(payer, input.solana);
  payer.setSpendControls(false); // the devnet token is not on the default list
  const http = new x402HTTPClient(payer);

  const client = new Client({ name: "aov-buyer", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(input.url)));
  const { tools } = await client.listTools();
  const calls = [];
  for (const call of input.calls) {
    const res = await client.callTool({ name: call.name, arguments: call.arguments });
    const demand = res.isError && res.structuredContent?.x402Version === 2 ? res.structuredContent : null;
    const entry = { name: call.name, first: { isError: res.isError === true, code: res._meta?.code ?? null, demand: demand !== null }, paid: null };
    if (demand) {
      const payment = await http.createPaymentPayload(demand);
      const paid = await client.callTool({ name: call.name, arguments: call.arguments, _meta: { "x402/payment": payment } });
      entry.paid = { isError: paid.isError === true, structuredContent: paid.structuredContent ?? null, paymentResponse: paid._meta?.["x402/payment-response"] ?? null };
    }
    calls.push(entry);
  }
  process.stdout.write(JSON.stringify({ tools: tools.map((t) => t.name), calls }) + "\n");
  await client.close();
} catch (e) {
  fail(e);
}
