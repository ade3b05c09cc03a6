// The official MCP TypeScript SDK client (Client +
// StreamableHTTPClientTransport, unmodified from node_modules) running in a
// web page on one origin and calling an MCP endpoint on another through
// headless Chromium (the system's, driven by playwright-core). Nothing is
// intercepted: the browser enforces CORS on every request the SDK makes.
//
// No bundler is installed, so this script serves the page and the SDK
// itself (node:http, on its own port: the page's origin): the SDK's ESM
// files and the ESM packages it imports as they are, named in the page's
// import map (package exports resolved with the "browser" condition first),
// and each CommonJS package it imports (content-type, ajv, ajv-formats)
// as an ES module holding that package's files, run by a minimal
// require() over one registry of the page's CommonJS files.
//
// The page connects (initialize, notifications/initialized, the SSE GET,
// whose answer it waits for), lists the tools, calls input.tool with
// input.args, ends the session (DELETE) and lists the tools once more on
// the ended session.
// Input on stdin: {"mcp", "chromium", "tool", "args"}.
// Output on stdout: {"sessionId", "tools": [names], "call": {isError,
// structuredContent}, "terminated": bool, "afterTerminate": "<error>",
// "error": "<the first error, if any>", "consoleErrors": [...]}.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { readStdinJSON, fail, launchChromium } from "./lib.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const nm = path.join(here, "node_modules");
const sdk = path.join(nm, "@modelcontextprotocol/sdk/dist/esm");
const entries = [path.join(sdk, "client/index.js"), path.join(sdk, "client/streamableHttp.js")];

// pickExport follows a package.json "exports" entry, preferring the
// browser's conditions.
function pickExport(entry) {
  if (typeof entry === "string") return entry;
  if (!entry || typeof entry !== "object") return null;
  for (const cond of ["browser", "import", "default"]) {
    if (cond in entry) {
      const got = pickExport(entry[cond]);
      if (got) return got;
    }
  }
  return null;
}

// resolveBare resolves a bare specifier to a file under node_modules.
function resolveBare(spec) {
  const parts = spec.split("/");
  const name = spec.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0];
  const sub = "." + spec.slice(name.length);
  const dir = path.join(nm, name);
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
  let target = null;
  let ex = pkg.exports;
  if (ex && (typeof ex === "string" || !Object.keys(ex).some((k) => k.startsWith(".")))) ex = { ".": ex };
  if (ex) {
    target = pickExport(ex[sub]);
    for (const [k, v] of Object.entries(ex)) {
      if (!target && k.endsWith("*") && sub.startsWith(k.slice(0, -1))) target = pickExport(v)?.replace("*", sub.slice(k.length - 1));
    }
  }
  if (!target && sub === ".") target = pkg.module ?? pkg.main ?? "index.js";
  if (!target) throw new Error(`cannot resolve ${spec}`);
  return path.join(dir, target);
}

function isESM(file) {
  if (file.endsWith(".mjs")) return true;
  if (file.endsWith(".cjs")) return false;
  for (let d = path.dirname(file); d.startsWith(nm); d = path.dirname(d)) {
    const p = path.join(d, "package.json");
    if (fs.existsSync(p)) return JSON.parse(fs.readFileSync(p, "utf8")).type === "module";
  }
  return false;
}

const staticImports = /(?:^|[;\n}])\s*(?:import|export)\s[^'"]*?from\s*['"]([^'"]+)['"]|(?:^|[;\n])\s*import\s*['"]([^'"]+)['"]/g;

// The ESM graph from the SDK's entries: the import map of its bare
// specifiers, and the CommonJS packages among them.
const importMap = {};
const cjs = new Map(); // specifier -> entry file
{
  const seen = new Set();
  const walk = (file) => {
    if (seen.has(file)) return;
    seen.add(file);
    const src = fs.readFileSync(file, "utf8");
    for (const m of src.matchAll(staticImports)) {
      const spec = m[1] ?? m[2];
      if (spec.startsWith(".")) {
        walk(path.resolve(path.dirname(file), spec));
        continue;
      }
      if (spec in importMap) continue;
      const target = resolveBare(spec);
      if (isESM(target)) {
        importMap[spec] = "/nm/" + path.relative(nm, target);
        walk(target);
      } else {
        importMap[spec] = "/cjs/" + encodeURIComponent(spec) + ".js";
        cjs.set(spec, target);
      }
    }
  };
  entries.forEach(walk);
}

// cjsModule is an ES module holding a CommonJS package's files (and the
// CommonJS packages they require), run by a minimal require() in the page.
function cjsModule(spec, entry) {
  const files = new Map(); // path -> {src, deps: {spec: path}}
  const visit = (file) => {
    if (files.has(file)) return;
    const src = fs.readFileSync(file, "utf8");
    const deps = {};
    files.set(file, { src, deps });
    if (file.endsWith(".json")) return;
    const req = createRequire(file);
    for (const m of src.matchAll(/\brequire\(\s*['"]([^'"]+)['"]\s*\)/g)) {
      deps[m[1]] = req.resolve(m[1]);
      visit(deps[m[1]]);
    }
  };
  visit(entry);
  const exported = Object.keys(createRequire(entry)(entry)).filter((k) => /^[A-Za-z_$][\w$]*$/.test(k) && k !== "default");
  // One registry for the page: a file two packages require (ajv-formats
  // requires ajv's codegen) is one instance, as in Node.
  let out = "const reg = (globalThis.__cjs ??= { defs: {}, cache: {} });\n";
  for (const [file, { src, deps }] of files) {
    const body = file.endsWith(".json") ? `module.exports = ${src};` : src;
    out += `reg.defs[${JSON.stringify(file)}] ??= [${JSON.stringify(deps)}, function (module, exports, require) {\n${body}\n}];\n`;
  }
  out += `reg.load ??= function load(file) {
  if (reg.cache[file]) return reg.cache[file].exports;
  const module = (reg.cache[file] = { exports: {} });
  const [deps, fn] = reg.defs[file];
  fn(module, module.exports, (s) => { if (!(s in deps)) throw new Error("require " + s); return load(deps[s]); });
  return module.exports;
};
const m = reg.load(${JSON.stringify(entry)});
export default m;
`;
  for (const k of exported) out += `export const ${k} = m.${k};\n`;
  return out;
}

const page = `<!doctype html><title>agent</title>
<script type="importmap">${JSON.stringify({ imports: importMap })}</script>
<script type="module">
import { Client } from "/nm/@modelcontextprotocol/sdk/dist/esm/client/index.js";
import { StreamableHTTPClientTransport } from "/nm/@modelcontextprotocol/sdk/dist/esm/client/streamableHttp.js";
window.__sdk = { Client, StreamableHTTPClientTransport };
</script>
<p>an agent's page</p>`;

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://page");
  try {
    if (url.pathname === "/") {
      res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
      return res.end(page);
    }
    if (url.pathname.startsWith("/cjs/")) {
      const spec = decodeURIComponent(url.pathname.slice(5, -3));
      if (!cjs.has(spec)) throw new Error("not a package of the graph");
      res.writeHead(200, { "Content-Type": "text/javascript" });
      return res.end(cjsModule(spec, cjs.get(spec)));
    }
    if (url.pathname.startsWith("/nm/")) {
      const file = path.resolve(nm, decodeURIComponent(url.pathname.slice(4)));
      if (!file.startsWith(nm + path.sep) || !file.endsWith(".js")) throw new Error("outside node_modules");
      res.writeHead(200, { "Content-Type": "text/javascript" });
      return res.end(fs.readFileSync(file));
    }
    res.writeHead(404).end();
  } catch (e) {
    res.writeHead(500, { "Content-Type": "text/plain" }).end(String(e));
  }
});

try {
  const input = await readStdinJSON();
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  const browser = await launchChromium(input.chromium);
  try {
    const p = await browser.newPage();
    const consoleErrors = [];
    p.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
    p.on("pageerror", (e) => consoleErrors.push(String(e)));
    await p.goto(`http://127.0.0.1:${server.address().port}/`, { waitUntil: "load" });
    await p.waitForFunction(() => window.__sdk, null, { timeout: 30000 });
    const out = await p.evaluate(async ({ mcp, tool, args }) => {
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
    }, { mcp: input.mcp, tool: input.tool, args: input.args });
    process.stdout.write(JSON.stringify({ ...out, consoleErrors }) + "\n");
  } finally {
    await browser.close();
  }
} catch (e) {
  fail(e);
} finally {
  server.close();
}
