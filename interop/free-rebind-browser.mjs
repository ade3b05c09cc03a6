// A DNS-rebinding page reading a free route: headless Chromium (the
// system's, driven by playwright-core) resolves rebind.evil.example to
// 127.0.0.1 (--host-resolver-rules), as a rebinding attack's DNS answers
// at last, opens input.page there (the attacker's page, now on the gate's
// address) and from it fetches /report/1: a same-origin GET, which carries
// no Origin, and whose answer the page reads.
// Input on stdin: {"page", "chromium"}.
// Output on stdout: {"status", "remaining": Free-Allowance-Remaining or "", "body"}.
import { readStdinJSON, fail, launchChromium } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const browser = await launchChromium(input.chromium, ["--host-resolver-rules=MAP rebind.evil.example 127.0.0.1"]);
  try {
    const page = await browser.newPage();
    await page.goto(input.page, { waitUntil: "load" });
    const out = await page.evaluate(async () => {
      const r = await fetch("/report/1");
      return { status: r.status, remaining: r.headers.get("Free-Allowance-Remaining") || "", body: await r.text() };
    });
    process.stdout.write(JSON.stringify(out) + "\n");
  } finally {
    await browser.close();
  }
} catch (e) {
  fail(e);
}
