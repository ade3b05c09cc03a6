// A web page that imports npm packages from node_modules as they are, for
// the browser tests: no bundler is installed, so modulePage serves the page
// and the packages itself (node:http, on its own port: the page's origin):
// the ESM files and the ESM packages they import as they are, named in the
// page's import map (package exports resolved with the "browser" condition
// first), and each CommonJS package imported (content-type, ajv,
// ajv-formats) as an ES module holding that package's files, run by a
// minimal require() over one registry of the page's CommonJS files.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { readStdinJSON, fail, launchChromium } from "./lib.mjs";

const nm = path.join(path.dirname(fileURLToPath(import.meta.url)), "node_modules");

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

// moduleGraph walks the ESM graph from entries (files): the import map of
// its bare specifiers, and the CommonJS packages among them. A specifier
// no installed package provides (an optional peer) maps to an empty
// module: the code that imports it is never run in these pages.
function moduleGraph(entries) {
  const importMap = {};
  const cjs = new Map(); // specifier -> entry file
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
      let target;
      try {
        target = resolveBare(spec);
      } catch {
        importMap[spec] = "/stub.js";
        continue;
      }
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
  return { importMap, cjs };
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

// modulePage returns a server (not yet listening) of a page titled title
// whose module script is script, after an import map of the packages the
// entries import: each entry a bare specifier (mapped too, so that script
// imports it by name) or a file under node_modules.
export function modulePage({ entries, title, script, body = "" }) {
  const files = entries.map((e) => (path.isAbsolute(e) ? e : resolveBare(e)));
  const { importMap, cjs } = moduleGraph(files);
  entries.forEach((e, i) => {
    if (!path.isAbsolute(e)) importMap[e] = "/nm/" + path.relative(nm, files[i]);
  });
  const page = `<!doctype html><title>${title}</title>
<script type="importmap">${JSON.stringify({ imports: importMap })}</script>
<script type="module">
${script}
</script>
${body}`;
  return http.createServer((req, res) => {
    const url = new URL(req.url, "http://page");
    try {
      if (url.pathname === "/") {
        res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
        return res.end(page);
      }
      if (url.pathname === "/stub.js") {
        res.writeHead(200, { "Content-Type": "text/javascript" });
        return res.end("export default {};");
      }
      if (url.pathname.startsWith("/cjs/")) {
        const spec = decodeURIComponent(url.pathname.slice(5, -3));
        if (!cjs.has(spec)) throw new Error("not a package of the graph");
        res.writeHead(200, { "Content-Type": "text/javascript" });
        return res.end(cjsModule(spec, cjs.get(spec)));
      }
      if (url.pathname.startsWith("/nm/")) {
        const file = path.resolve(nm, decodeURIComponent(url.pathname.slice(4)));
        if (!file.startsWith(nm + path.sep) || !/\.m?js$/.test(file)) throw new Error("outside node_modules");
        res.writeHead(200, { "Content-Type": "text/javascript" });
        return res.end(fs.readFileSync(file));
      }
      res.writeHead(404).end();
    } catch (e) {
      res.writeHead(500, { "Content-Type": "text/plain" }).end(String(e));
    }
  });
}

// runModulePage is a browser script's whole run: it reads the input from
// stdin, serves server's page on a free loopback port (the page's origin),
// opens it in headless Chromium at input.chromium, waits until the page's
// module script has set window[ready], runs fn in the page with
// args(input), and prints what fn returns with the page's console errors.
// Any error fails the script.
export async function runModulePage(server, ready, fn, args) {
  try {
    const input = await readStdinJSON();
    await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
    const browser = await launchChromium(input.chromium);
    try {
      const page = await browser.newPage();
      const consoleErrors = [];
      page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
      page.on("pageerror", (e) => consoleErrors.push(String(e)));
      await page.goto(`http://127.0.0.1:${server.address().port}/`, { waitUntil: "load" });
      await page.waitForFunction((name) => window[name], ready, { timeout: 30000 });
      const out = await page.evaluate(fn, args(input));
      process.stdout.write(JSON.stringify({ ...out, consoleErrors }) + "\n");
    } finally {
      await browser.close();
    }
  } catch (e) {
    fail(e);
  } finally {
    server.close();
  }
}
