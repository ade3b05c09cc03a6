// A buyer's agent that wants idempotent retries, with the official
// payment-identifier helpers of @x402/extensions and the official fetch
// wrapper (@x402/fetch over @x402/core + @x402/evm). It:
//   1. reads the route's PAYMENT-REQUIRED and checks its declaration with
//      the official helpers (and against declarePaymentIdentifierExtension);
//   2. pays once through wrapFetchWithPayment, with the id attached by
//      appendPaymentIdentifierToExtensions in onBeforePaymentCreation;
//   3. sends the very payment it sent (same id, same payload) again, as a
//      client retrying after a lost answer does;
//   4. pays again through the wrapper with the same id, which signs a new
//      payment (new nonce) under it;
//   5. judges a list of ids with isValidPaymentId, for the Go side to
//      compare with its own rule.
// Input on stdin: {"privateKey", "url", "body", "id", "ids": [...]}.
// Output on stdout: {"declared", "declaredIsReference", "validation",
// "required", "extracted", "first", "replay", "second", "idChecks"}, each
// answer as {"status", "body", "paymentResponse"}.
import { x402Client } from "@x402/core/client";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { wrapFetchWithPayment, decodePaymentResponseHeader } from "@x402/fetch";
import {
  PAYMENT_IDENTIFIER,
  appendPaymentIdentifierToExtensions,
  declarePaymentIdentifierExtension,
  extractPaymentIdentifier,
  isPaymentIdentifierExtension,
  isPaymentIdentifierRequired,
  isValidPaymentId,
  validatePaymentIdentifier,
} from "@x402/extensions/payment-identifier";
import { privateKeyToAccount } from "viem/accounts";
import { isDeepStrictEqual } from "node:util";
import { readStdinJSON, fail } from "./lib.mjs";

const decode = (h) => JSON.parse(Buffer.from(h, "base64").toString("utf8"));

async function answer(res) {
  const header = res.headers.get("PAYMENT-RESPONSE");
  return { status: res.status, body: await res.text(), paymentResponse: header ? decodePaymentResponseHeader(header) : null };
}

try {
  const input = await readStdinJSON();
  const init = () => ({ method: "POST", headers: { "Content-Type": "application/json" }, body: input.body });

  const demand = await fetch(input.url, init());
  await demand.text();
  const pr = decode(demand.headers.get("PAYMENT-REQUIRED"));
  const declared = pr.extensions?.[PAYMENT_IDENTIFIER];
  if (!isPaymentIdentifierExtension(declared)) throw new Error(`no payment-identifier declaration: ${JSON.stringify(pr.extensions)}`);
  const required = isPaymentIdentifierRequired(declared);

  const client = new x402Client();
  registerExactEvmScheme(client, { signer: privateKeyToAccount(input.privateKey) });
  client.setSpendControls(false); // the devnet token is unknown to the default allow-list
  client.onBeforePaymentCreation(async ({ paymentRequired }) => {
    if (paymentRequired.extensions) appendPaymentIdentifierToExtensions(paymentRequired.extensions, input.id);
  });
  // Record every PAYMENT-SIGNATURE the wrapper sends.
  const sent = [];
  const recording = (resource, options) => {
    const req = new Request(resource, options);
    const sig = req.headers.get("PAYMENT-SIGNATURE");
    if (sig) sent.push(sig);
    return fetch(req);
  };
  const pay = wrapFetchWithPayment(recording, client);

  const first = await answer(await pay(input.url, init()));
  if (sent.length !== 1) throw new Error(`the wrapper sent ${sent.length} payments`);
  const payload = decode(sent[0]);

  const again = init();
  again.headers["PAYMENT-SIGNATURE"] = sent[0];
  const replay = await answer(await fetch(input.url, again));

  const second = await answer(await pay(input.url, init()));

  process.stdout.write(JSON.stringify({
    declared,
    declaredIsReference: isDeepStrictEqual(declared, declarePaymentIdentifierExtension(required)),
    validation: validatePaymentIdentifier(payload.extensions?.[PAYMENT_IDENTIFIER]),
    required,
    extracted: extractPaymentIdentifier(payload),
    first,
    replay,
    second,
    idChecks: Object.fromEntries((input.ids || []).map((id) => [id, isValidPaymentId(id)])),
  }) + "\n");
} catch (e) {
  fail(e);
}
