// The official MCP TypeScript SDK client (Client +
// StreamableHTTPClientTransport, unmodified from node_modules) running in a
// web page on one origin and calling an MCP endpoint on another through
// headless Chromium (the system's, driven by playwright-core). Nothing is
// intercepted: the browser enforces CORS on every request the SDK makes.
// The page and the SDK are served by browser-modules.mjs.
//
// The page connects (initialize, notifications/initialized, the SSE GET,
// whose answer it waits for), lists the tools, calls input.tool with
// input.args, ends the session (DELETE) and lists the tools once more on
// the ended session.
// Input on stdin: {"mcp", "chromium", "tool", "args"}.
// Output on stdout: {"sessionId", "tools": [names], "call": {isError,
// structuredContent}, "terminated": bool, "afterTerminate": "<error>",
// "error": "<the first error, if any>", "consoleErrors": [...]}.
import path from "node:path";
import { fileURLToPath } from "node:url";
import { modulePage, runModulePage } from "./browser-modules.mjs";

const sdk = path.join(path.dirname(fileURLToPath(import.meta.url)), "node_modules/@modelcontextprotocol/sdk/dist/esm");
const server = modulePage({
  entries: [path.join(sdk, "client/index.js"), path.join(sdk, "client/streamableHttp.js")],
  title: "agent",
  script: `import { Client } from "/nm/@modelcontextprotocol/sdk/dist/esm/client/index.js";
import { StreamableHTTPClientTransport } from "/nm/@modelcontextprotocol/sdk/dist/esm/client/streamableHttp.js";
window.__sdk = { Client, StreamableHTTPClientTransport };`,
  body: "<p>an agent's page</p>",
});

await runModulePage(server, "__sdk", async ({ mcp, tool, args }) => {
  const { Client, StreamableHTTPClientTransport } = window.__sdk;
  const out = { sessionId: "", tools: [], call: null, terminated: false, afterTerminate: "", error: "" };
  try {
    const client = new Client({ name: "page", version: "1" });
    // The SDK opens its SSE stream (a GET) once initialized without
    // waiting for it, so on a busy machine the GET could reach the
    // server after the session's DELETE. The page waits (10 s at most)
    // until the browser has the GET's answer before going on; the
    // transport's fetch option is the browser's own fetch, watched, not
    // changed.
    let sseAnswered;
    const sse = new Promise((ok) => (sseAnswered = ok));
    const watched = async (url, init) => {
      const res = await fetch(url, init);
      if ((init?.method ?? "GET") === "GET") sseAnswered();
      return res;
    };
    const transport = new StreamableHTTPClientTransport(new URL(mcp), { fetch: watched });
    await client.connect(transport);
    await Promise.race([sse, new Promise((ok) => setTimeout(ok, 10000))]);
    out.sessionId = transport.sessionId ?? "";
    out.tools = (await client.listTools()).tools.map((t) => t.name);
    const res = await client.callTool({ name: tool, arguments: args });
    out.call = { isError: res.isError === true, structuredContent: res.structuredContent ?? null };
    await transport.terminateSession();
    out.terminated = transport.sessionId === undefined;
    try {
      await client.listTools();
    } catch (e) {
      out.afterTerminate = String(e);
    }
    await client.close();
  } catch (e) {
    out.error = String(e);
  }
  return out;
}, (input) => ({ mcp: input.mcp, tool: input.tool, args: input.args }));
