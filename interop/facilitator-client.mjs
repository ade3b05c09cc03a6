// Calls a facilitator with the official HTTPFacilitatorClient (@x402/core/http),
// as x402 resource servers do. Input on stdin: {"url", "paymentPayload",
// "paymentRequirements", "ops": ["supported", "verify", "settle"]}. Output:
// {"supported"?, "verify"?, "settle"?}, each the client's result or
// {"thrown": "<error name>: <message>"} when the client threw.
import { HTTPFacilitatorClient } from "@x402/core/http";
import { readStdinJSON, fail } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const client = new HTTPFacilitatorClient({ url: input.url });
  const out = {};
  for (const op of input.ops) {
    try {
      if (op === "supported") out.supported = await client.getSupported();
      else if (op === "verify") out.verify = await client.verify(input.paymentPayload, input.paymentRequirements);
      else if (op === "settle") out.settle = await client.settle(input.paymentPayload, input.paymentRequirements);
      else throw new Error(`unknown op ${op}`);
    } catch (e) {
      out[op] = { thrown: `${e.name}: ${e.message}` };
    }
  }
  process.stdout.write(JSON.stringify(out) + "\n");
} catch (e) {
  fail(e);
}
