// A web page on one origin calling the gateway on another: headless
// Chromium (the system's, driven by playwright-core) opens input.page and,
// from that page, runs fetch() against input.api:
//   1. GET <api>/score/agent-1: the 402, and whether the page can read its
//      PAYMENT-REQUIRED header (only with Access-Control-Expose-Headers);
//   2. POST <api>/verify/schema with Content-Type: application/json and
//      PAYMENT-SIGNATURE: a request the browser sends only after a CORS
//      preflight the gateway allowed;
//   3. GET <api>/private/agent-1, a route without CORS: the browser must
//      block it;
//   4. GET <api>/reflect/agent-1, a route whose x402_cors lists another
//      origin, in front of an upstream that grants every origin: the
//      browser must block it too.
// Input on stdin: {"page", "api", "chromium", "signature", "body"}.
// Output on stdout: {"unpaid": {status, paymentRequired}, "paid": {status,
// paymentResponse, body}, "blocked": "<fetch error, or empty if it was not blocked>",
// "blockedReflected": the same for step 4}.
import { readStdinJSON, fail, launchChromium } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const browser = await launchChromium(input.chromium);
  try {
    const page = await browser.newPage();
    await page.goto(input.page, { waitUntil: "load" });
    const out = await page.evaluate(async ({ api, signature, body }) => {
      const r1 = await fetch(api + "/score/agent-1");
      const unpaid = { status: r1.status, paymentRequired: r1.headers.get("PAYMENT-REQUIRED") ?? "" };
      const r2 = await fetch(api + "/verify/schema", {
        method: "POST",
        headers: { "Content-Type": "application/json", "PAYMENT-SIGNATURE": signature },
        body,
      });
      const paid = { status: r2.status, paymentResponse: r2.headers.get("PAYMENT-RESPONSE") ?? "", body: await r2.text() };
      let blocked = "";
      try {
        await fetch(api + "/private/agent-1");
      } catch (e) {
        blocked = String(e);
      }
      let blockedReflected = "";
      try {
        await fetch(api + "/reflect/agent-1");
      } catch (e) {
        blockedReflected = String(e);
      }
      return { unpaid, paid, blocked, blockedReflected };
    }, { api: input.api, signature: input.signature, body: input.body });
    process.stdout.write(JSON.stringify(out) + "\n");
  } finally {
    await browser.close();
  }
} catch (e) {
  fail(e);
}
