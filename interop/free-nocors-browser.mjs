// A page on another site spending its visitor's free calls without reading
// them: headless Chromium (the system's, driven by playwright-core) opens
// input.page and, from that page, loads input.url as an <img> and with
// fetch(…, {mode: "no-cors"}), the two GETs a browser sends with no Origin.
// Input on stdin: {"page", "url", "chromium"}.
// Output on stdout: {"image": "load" or "error", "noCors": the fetch's
// response type ("opaque" once the answer arrived) or its error}.
import { readStdinJSON, fail, launchChromium } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const browser = await launchChromium(input.chromium);
  try {
    const page = await browser.newPage();
    await page.goto(input.page, { waitUntil: "load" });
    const out = await page.evaluate(async (url) => {
      const image = await new Promise((resolve) => {
        const img = new Image();
        img.onload = () => resolve("load");
        img.onerror = () => resolve("error");
        img.src = url;
      });
      let noCors;
      try {
        noCors = (await fetch(url, { mode: "no-cors" })).type;
      } catch (e) {
        noCors = String(e);
      }
      return { image, noCors };
    }, input.url);
    process.stdout.write(JSON.stringify(out) + "\n");
  } finally {
    await browser.close();
  }
} catch (e) {
  fail(e);
}
