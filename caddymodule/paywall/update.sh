#!/usr/bin/env bash
# Vendors the official x402 paywall pages that the gateway serves from the
# binary (go:embed) with `paywall official`: the self-contained EVM and
# Solana pages (one HTML file each, React app and wallet code inlined) taken
# byte for byte from the @x402/paywall npm package, where they ship as the
# string constants EVM_PAYWALL_TEMPLATE and SVM_PAYWALL_TEMPLATE.
#
#   caddymodule/paywall/update.sh            # the latest @x402/paywall
#   caddymodule/paywall/update.sh 2.12.0     # a given version
#
# It records the version and the package's integrity hash in VERSION; the Go
# tests check that the pages are present and that VERSION names them. The
# package is Apache-2.0 and ships no licence file; LICENSE here is the
# Apache-2.0 text and NOTICE names the package and the bundled libraries
# (their notices are at the end of each page, as the package ships them).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="${1:-$(npm view @x402/paywall version)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cd "$tmp"
npm pack --silent "@x402/paywall@${version}" >/dev/null
tar xzf "x402-paywall-${version}.tgz"
integrity="$(npm view "@x402/paywall@${version}" dist.integrity)"
license="$(node -p 'require("./package/package.json").license')"
[ "$license" = "Apache-2.0" ] || { echo "@x402/paywall ${version} is licensed ${license}, not Apache-2.0: check LICENSE and NOTICE by hand" >&2; exit 1; }

# The template is a JavaScript string literal in the package's ESM build;
# evaluate only that literal (no other code of the package runs).
node --input-type=module - "$here" <<'EOJS'
import { readFileSync, writeFileSync } from "node:fs";
import { runInNewContext } from "node:vm";
const out = process.argv[2];
for (const [dir, name, file] of [["evm", "EVM_PAYWALL_TEMPLATE", "evm.html"], ["svm", "SVM_PAYWALL_TEMPLATE", "svm.html"]]) {
  const src = readFileSync(`package/dist/esm/${dir}/index.js`, "utf8");
  const start = src.indexOf(`${name} = '`);
  if (start < 0) throw new Error(`${name} not found in ${dir}/index.js`);
  const from = start + name.length + 3;
  const end = src.indexOf("';\n", from);
  const html = runInNewContext(src.slice(from, end + 1));
  if (typeof html !== "string" || !html.includes("</head>") || !html.includes('id="root"')) throw new Error(`${name} is not the page`);
  writeFileSync(`${out}/${file}`, html);
}
EOJS

cat >"$here/VERSION" <<EOV
@x402/paywall ${version}
integrity ${integrity}
EOV
echo "vendored @x402/paywall ${version} into ${here}"
