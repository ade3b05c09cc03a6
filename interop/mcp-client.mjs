// Calls verifierd's MCP endpoint with the official MCP TypeScript SDK
// (Client + StreamableHTTPClientTransport), as an agent's MCP client would.
// Input on stdin: {"url": "<base>/mcp", "headers": {…extra request headers…},
// "calls": [{"name": "verify_schema", "arguments": {…}}, …]}.
// Output on stdout: {"server": {name, version}, "tools": [{name, title,
// description, inputSchema, annotations}], "results": [{isError, text,
// structuredContent}, …]} in the order of calls.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { readStdinJSON, fail } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const client = new Client({ name: "aov-interop", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(input.url), {
    requestInit: { headers: input.headers ?? {} },
  });
  await client.connect(transport);
  const { tools } = await client.listTools();
  const results = [];
  for (const call of input.calls ?? []) {
    const res = await client.callTool({ name: call.name, arguments: call.arguments });
    const text = res.content?.find((c) => c.type === "text")?.text ?? null;
    results.push({ isError: res.isError === true, contentItems: res.content?.length ?? 0, text, structuredContent: res.structuredContent ?? null });
  }
  process.stdout.write(JSON.stringify({ server: client.getServerVersion(), tools, results }) + "\n");
  await client.close();
} catch (e) {
  fail(e);
}
