// A person on the interactive API docs: headless Chromium (the system's,
// driven by playwright-core; no browser is downloaded) opens /docs, waits
// for Swagger UI to render the operations from /openapi.json, opens one
// operation, presses "Try it out" and "Execute", and reads the answer the
// page renders.
// Input on stdin: {"base": "http://127.0.0.1:port", "chromium": "/usr/bin/chromium",
// "operation": "operations-Verification-verifySchema"}.
// Output on stdout: {"title", "operations": ["POST /verify/schema", …],
// "status": "200", "requestURL", "response": "<rendered response text>",
// "otherOrigins": [urls requested from another origin], "consoleErrors": [...]}.
import { readStdinJSON, fail, launchChromium } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const origin = new URL(input.base).origin;
  const browser = await launchChromium(input.chromium);
  try {
    const page = await browser.newPage();
    const otherOrigins = [];
    const consoleErrors = [];
    page.on("request", (req) => {
      const u = new URL(req.url());
      if (u.protocol.startsWith("http") && u.origin !== origin) otherOrigins.push(req.url());
    });
    page.on("console", (msg) => { if (msg.type() === "error") consoleErrors.push(msg.text()); });
    page.on("pageerror", (err) => consoleErrors.push(String(err)));

    await page.goto(input.base + "/docs", { waitUntil: "load" });
    await page.waitForSelector(".opblock-summary", { timeout: 30000 });
    const operations = await page.$$eval(".opblock", (blocks) => blocks.map((b) => {
      const m = b.querySelector(".opblock-summary-method")?.textContent?.trim();
      const p = b.querySelector(".opblock-summary-path")?.getAttribute("data-path");
      return `${m} ${p}`;
    }));

    const op = page.locator("#" + input.operation);
    await op.locator(".opblock-summary").first().click();
    const tryOut = op.locator("button.try-out__btn");
    await tryOut.waitFor({ timeout: 15000 });
    if ((await tryOut.textContent()).includes("Try it out")) await tryOut.click();
    await op.locator("button.execute").click();
    const status = op.locator(".live-responses-table .response .response-col_status");
    await status.waitFor({ timeout: 30000 });
    const requestURL = await op.locator(".request-url pre").first().textContent().catch(() => "");
    const response = await op.locator(".live-responses-table").innerText();

    process.stdout.write(JSON.stringify({
      title: await page.title(),
      operations,
      status: (await status.textContent()).trim(),
      requestURL: (requestURL || "").trim(),
      response,
      otherOrigins,
      consoleErrors,
    }) + "\n");
  } finally {
    await browser.close();
  }
} catch (e) {
  fail(e);
}
