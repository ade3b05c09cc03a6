// Shared helpers of the interop scripts.
import http from "node:http";
export async function readStdinJSON() {
  let data = "";
  for await (const chunk of process.stdin) data += chunk;
  return JSON.parse(data);
}

export function fail(e) {
  process.stderr.write(`${e?.stack ?? e}\n`);
  process.exit(1);
}

// serveFacilitator puts an official x402Facilitator behind a minimal
// node:http server (no HTTP server ships with @x402/core): POST /verify,
// POST /settle, GET /supported. Once listening it prints
// {"url": "http://127.0.0.1:<port>", ...ready} and it exits when stdin
// closes, as the Go tests that start it expect.
export function serveFacilitator(facilitator, ready = {}) {
  const server = http.createServer(async (req, res) => {
    const reply = (status, body) => {
      res.writeHead(status, { "Content-Type": "application/json" });
      res.end(JSON.stringify(body, (_, v) => (typeof v === "bigint" ? v.toString() : v)));
    };
    try {
      if (req.method === "GET" && req.url === "/supported") return reply(200, facilitator.getSupported());
      if (req.method !== "POST" || (req.url !== "/verify" && req.url !== "/settle")) return reply(404, { error: "not found" });
      let body = "";
      for await (const chunk of req) body += chunk;
      const { paymentPayload, paymentRequirements } = JSON.parse(body);
      const op = req.url === "/verify" ? "verify" : "settle";
      reply(200, await facilitator[op](paymentPayload, paymentRequirements));
    } catch (e) {
      reply(500, { error: String(e?.message ?? e) });
    }
  });
  server.listen(0, "127.0.0.1", () => {
    process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${server.address().port}`, ...ready }) + "\n");
  });
  process.stdin.on("end", () => server.close(() => process.exit(0)));
  process.stdin.resume();
}

// launchChromium starts headless Chromium (Debian's, at path) with the
// flags a closed-network machine needs: no sandbox as root, no GPU, QUIC,
// first-run or background networking (whose connections would be refused).
// playwright-core gives every launch a fresh temporary profile; args are
// added to those flags.
export async function launchChromium(path, args = []) {
  const { chromium } = await import("playwright-core");
  return chromium.launch({
    executablePath: path,
    headless: true,
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      ...args,
    ],
  });
}
