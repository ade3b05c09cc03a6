// Settles a payment as the official x402ResourceServer (@x402/core/server)
// does, through its settleWithPendingRetry and the official
// HTTPFacilitatorClient: one /settle, and one more only for an answer
// {success:false, errorReason:"settlement_pending", transaction}. Input on
// stdin: {"url", "paymentPayload", "paymentRequirements"}. Output:
// {"settle"}, the result, or {"thrown": "<error name>: <message>"} when it
// threw.
import { HTTPFacilitatorClient } from "@x402/core/http";
import { x402ResourceServer } from "@x402/core/server";
import { readStdinJSON, fail } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const client = new HTTPFacilitatorClient({ url: input.url });
  const server = new x402ResourceServer(client);
  let settle;
  try {
    settle = await server.settleWithPendingRetry(client, input.paymentPayload, input.paymentRequirements);
  } catch (e) {
    settle = { thrown: `${e.name}: ${e.message}` };
  }
  process.stdout.write(JSON.stringify({ settle }) + "\n");
} catch (e) {
  fail(e);
}
