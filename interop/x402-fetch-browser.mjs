// The official x402 fetch client (@x402/fetch's wrapFetchWithPayment over
// @x402/core, @x402/evm and viem, unmodified from node_modules) in a web
// page on one origin, paying for a POST on another through headless
// Chromium (the system's, driven by playwright-core): the browser enforces
// CORS on every request the client makes, its paid retry's extra request
// header (Access-Control-Expose-Headers) among them. The page and the
// packages are served by browser-modules.mjs.
// Input on stdin: {"url", "body", "privateKey", "chromium"}.
// Output on stdout: {"status", "paymentResponse", "body", "error",
// "requests": ["METHOD header,names"], "consoleErrors"}.
import { modulePage, runModulePage } from "./browser-modules.mjs";

const server = modulePage({
  entries: ["@x402/fetch", "@x402/core/client", "@x402/evm/exact/client", "viem/accounts"],
  title: "buyer",
  script: `import { wrapFetchWithPayment } from "@x402/fetch";
import { x402Client } from "@x402/core/client";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { privateKeyToAccount } from "viem/accounts";
window.__x402 = { wrapFetchWithPayment, x402Client, registerExactEvmScheme, privateKeyToAccount };`,
  body: "<p>a buyer's page</p>",
});

await runModulePage(server, "__x402", async ({ url, body, privateKey }) => {
  const { wrapFetchWithPayment, x402Client, registerExactEvmScheme, privateKeyToAccount } = window.__x402;
  const out = { status: 0, paymentResponse: "", body: "", error: "", requests: [] };
  try {
    const client = new x402Client();
    registerExactEvmScheme(client, { signer: privateKeyToAccount(privateKey) });
    client.setSpendControls(false); // the devnet token is not on the default list
    // The browser's own fetch, watched, not changed: the header names
    // of each request the client makes.
    const watched = async (input, init) => {
      const req = new Request(input, init);
      const names = [];
      req.headers.forEach((v, k) => names.push(k));
      out.requests.push(req.method + " " + names.sort().join(","));
      return fetch(req);
    };
    const pay = wrapFetchWithPayment(watched, client);
    const res = await pay(url, { method: "POST", headers: { "Content-Type": "application/json" }, body });
    out.status = res.status;
    out.paymentResponse = res.headers.get("PAYMENT-RESPONSE") ?? "";
    out.body = await res.text();
  } catch (e) {
    out.error = String(e) + (e && e.cause ? " cause: " + String(e.cause) : "");
  }
  return out;
}, (input) => ({ url: input.url, body: input.body, privateKey: input.privateKey }));
