// Compiles the test contracts with the solc-js pinned in interop/package.json and
// writes their ABI and runtime-creation bytecode next to the Go code that embeds
// them. Regenerate after editing a .sol file:
//
//   (cd interop && npm ci) && node contracts/build.mjs
//
// `node contracts/build.mjs --out DIR` writes to DIR instead (the Go test that
// checks the committed files against a fresh compile uses it).
import { createRequire } from "node:module";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "..", "interop", "package.json"));
const solc = require("solc");

const contracts = ["TestUSDC", "TestSmartWallet"];
let out = join(here, "..", "plugins", "evmfacilitator", "devnet");
const i = process.argv.indexOf("--out");
if (i >= 0) out = process.argv[i + 1];

const sources = {};
for (const c of contracts) sources[`${c}.sol`] = { content: readFileSync(join(here, `${c}.sol`), "utf8") };

const input = {
  language: "Solidity",
  sources,
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: "cancun",
    metadata: { bytecodeHash: "none", appendCBOR: false },
    outputSelection: { "*": { "*": ["abi", "evm.bytecode.object"] } },
  },
};
const result = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (result.errors || []).filter((e) => e.severity === "error");
for (const e of result.errors || []) console.error(e.formattedMessage);
if (errors.length) process.exit(1);

mkdirSync(out, { recursive: true });
for (const c of contracts) {
  const { abi, evm } = result.contracts[`${c}.sol`][c];
  writeFileSync(join(out, `${c}.abi.json`), JSON.stringify(abi, null, 2) + "\n");
  writeFileSync(join(out, `${c}.bin`), evm.bytecode.object + "\n");
}
console.log(`solc ${solc.version()}: wrote ${contracts.join(", ")} to ${out}`);
