// An MCP client in a web page on one origin calling an MCP endpoint on
// another: headless Chromium (the system's, driven by playwright-core)
// opens input.page and, from that page, speaks MCP's Streamable HTTP
// transport with fetch() exactly as the official TypeScript SDK's
// StreamableHTTPClientTransport does (its headers, methods and order):
//   1. POST initialize; the page reads Mcp-Session-Id from the answer;
//   2. POST notifications/initialized, then every later request, with
//      Mcp-Session-Id and MCP-Protocol-Version (which need a preflight);
//   3. GET with Accept: text/event-stream (the server's SSE stream), kept
//      open as the SDK keeps it;
//   4. POST tools/list, and POST tools/call of input.tool with input.args;
//   5. GET again with Last-Event-ID (a resumed stream);
//   6. DELETE (end the session), then the page waits (10 s at most) until
//      the SSE stream of step 3 ends, as the server ends it with the
//      session, and sends tools/list once more on the ended session.
// Every answer but the SSE stream's is read to its end before the next
// step. A step never aborts its request: Chromium does not close the
// connection of a request aborted mid-answer, but may go on reading the
// answer in the background (draining it) and then hand the connection to
// a later request, so an aborted SSE GET would stay open at the server
// while later steps run, and end at a moment no step controls.
// The browser blocks any step whose CORS answer does not allow it; the
// page then records the error.
// Input on stdin: {"page", "mcp", "chromium", "tool", "args"}.
// Output on stdout: {"steps": [{name, status, sessionId, body, error}, …],
// "sseEnd": "ended" | "<why not>"}.
import { readStdinJSON, fail, launchChromium } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const browser = await launchChromium(input.chromium);
  try {
    const page = await browser.newPage();
    await page.goto(input.page, { waitUntil: "load" });
    const out = await page.evaluate(async ({ mcp, tool, args }) => {
      const steps = [];
      let session = "";
      let version = "";
      let id = 0;
      const headers = (extra) => {
        const h = { ...extra };
        if (session) h["mcp-session-id"] = session;
        if (version) h["mcp-protocol-version"] = version;
        return h;
      };
      // step sends one request and reads its answer to the end, or, with
      // open, leaves the answer's body unread in stream.
      let stream = null;
      const step = async (name, method, extra, body, open = false) => {
        const s = { name, status: 0, sessionId: "", body: null, error: "" };
        try {
          const init = { method, headers: headers(extra) };
          if (body !== undefined) init.body = JSON.stringify(body);
          const r = await fetch(mcp, init);
          s.status = r.status;
          s.sessionId = r.headers.get("mcp-session-id") ?? "";
          if (open) {
            stream = r;
          } else {
            const text = await r.text();
            if ((r.headers.get("content-type") ?? "").startsWith("application/json")) s.body = JSON.parse(text);
          }
        } catch (e) {
          s.error = String(e);
        }
        steps.push(s);
        return s;
      };
      const post = { "content-type": "application/json", accept: "application/json, text/event-stream" };
      const rpc = (method, params) => ({ jsonrpc: "2.0", id: ++id, method, params });

      const init = await step("initialize", "POST", post, rpc("initialize", {
        protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "page", version: "1" },
      }));
      session = init.sessionId;
      version = init.body?.result?.protocolVersion ?? "";
      await step("initialized", "POST", post, { jsonrpc: "2.0", method: "notifications/initialized" });
      await step("sse", "GET", { accept: "text/event-stream" }, undefined, true);
      await step("tools/list", "POST", post, rpc("tools/list", {}));
      await step("tools/call", "POST", post, rpc("tools/call", { name: tool, arguments: args }));
      await step("sse-resume", "GET", { accept: "text/event-stream", "last-event-id": "0" });
      await step("delete", "DELETE", {});
      let sseEnd = "no SSE stream was open";
      if (stream) {
        sseEnd = await Promise.race([
          stream.text().then(() => "ended", (e) => String(e)),
          new Promise((ok) => setTimeout(() => ok("still open 10 s after the DELETE"), 10000)),
        ]);
      }
      await step("after-delete", "POST", post, rpc("tools/list", {}));
      return { steps, sseEnd };
    }, { mcp: input.mcp, tool: input.tool, args: input.args });
    process.stdout.write(JSON.stringify(out) + "\n");
  } finally {
    await browser.close();
  }
} catch (e) {
  fail(e);
}
