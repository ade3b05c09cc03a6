// A web page calling the devnet's JSON-RPC from another origin, as the
// official EVM paywall page and viem in a dapp do: headless Chromium (the
// system's, driven by playwright-core) opens input.page and, from that page,
// POSTs JSON-RPC with fetch() (Content-Type: application/json, so only after
// a CORS preflight) to input.rpc. No request is intercepted: the browser
// enforces CORS on the devnet's own answers.
// Input on stdin: {"page", "rpc", "chromium", "calls": [{method, params}, …]}.
// Output on stdout: {"results": [{result, error}, …]} in the order of calls,
// error being the fetch or JSON-RPC error.
import { readStdinJSON, fail, launchChromium } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const browser = await launchChromium(input.chromium);
  try {
    const page = await browser.newPage();
    await page.goto(input.page, { waitUntil: "load" });
    const out = await page.evaluate(async ({ rpc, calls }) => {
      const results = [];
      let id = 0;
      for (const { method, params } of calls) {
        try {
          const r = await fetch(rpc, {
            method: "POST",
            headers: { "Content-Type": "application/json" },
            body: JSON.stringify({ jsonrpc: "2.0", id: ++id, method, params }),
          });
          const msg = await r.json();
          results.push({ result: msg.result ?? null, error: msg.error ? JSON.stringify(msg.error) : "" });
        } catch (e) {
          results.push({ result: null, error: String(e) });
        }
      }
      return { results };
    }, { rpc: input.rpc, calls: input.calls });
    process.stdout.write(JSON.stringify(out) + "\n");
  } finally {
    await browser.close();
  }
} catch (e) {
  fail(e);
}
