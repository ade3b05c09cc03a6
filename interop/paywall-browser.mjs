// A person on the official x402 paywall: headless Chromium (the system's,
// driven by playwright-core) opens a priced URL as a browser does (Accept:
// text/html), and the gateway answers 402 with the official @x402/paywall
// page. The page's text is reported. With a key, a wallet extension is stood
// in for by an injected wallet whose accounts and signatures come from that
// devnet key, held here in Node, never in the page; the person selects and
// connects it, presses "Pay now", and the page signs, fetches the URL again
// with PAYMENT-SIGNATURE and shows the content.
//   - input.key (0x hex): an EIP-1193 provider (window.ethereum, also
//     announced over EIP-6963) signing EIP-712 typed data with viem.
//   - input.solanaKey (base58 of the 64-byte secret key): a wallet-standard
//     wallet (registered as @wallet-standard/wallet's registerWallet does,
//     over the wallet-standard:register-wallet / app-ready events) with
//     standard:connect, standard:disconnect, standard:events and
//     solana:signTransaction on solana:devnet, signing with @solana/kit.
//     A silent connect (the page tries one on load) gets no accounts until
//     the person has connected, as a wallet that was never authorised does.
// The page's JSON-RPC calls (balances, token metadata, the blockhash) go to
// its chain's public RPC URL, which the page does not let a site configure;
// they are answered from input.rpc (the local chain). With input.rpcAt (the
// URL the page calls, http only) nothing is intercepted: Chromium connects
// to input.rpc's host and port whenever the page calls rpcAt's
// (--host-resolver-rules), so the chain's own answers, CORS headers and
// preflights included, reach the page, and the browser enforces CORS on
// them. Otherwise the calls are answered here (a fulfilled answer skips the
// browser's CORS check). Nothing else leaves the gateway's origin: every
// other request is refused and reported.
// Input on stdin: {"url", "chromium", "rpc"?, "rpcAt"?, "key"?, "solanaKey"?}.
// Output on stdout: {"status", "encoding": "<the page's Content-Encoding>",
// "text": "<page text>", "paid": "<text after paying>",
// "balance": "<the balance the page shows once connected>",
// "offPageRequests": [urls off the origin], "refused": [those not answered],
// "signed": <number of signatures the wallet made>,
// "chains": [the chain of each Solana signing request], "consoleErrors": [...]}.
import { privateKeyToAccount } from "viem/accounts";
import {
  createKeyPairFromBytes, getAddressFromPublicKey, getBase58Encoder,
  getTransactionDecoder, getTransactionEncoder, partiallySignTransaction,
} from "@solana/kit";
import { readStdinJSON, fail, launchChromium } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const origin = new URL(input.url).origin;
  const rpcAt = input.rpcAt ? new URL(input.rpcAt) : null;
  const browser = await launchChromium(input.chromium, rpcAt
    ? [`--host-resolver-rules=MAP ${rpcAt.host} ${new URL(input.rpc).host}`]
    : []);
  try {
    const context = await browser.newContext();
    const offPageRequests = [];
    const refused = [];
    const consoleErrors = [];
    const chains = [];
    let signed = 0;
    context.on("request", (req) => {
      const u = new URL(req.url());
      if (u.origin !== origin && u.protocol.startsWith("http")) offPageRequests.push(req.url());
    });
    await context.route((u) => u.origin !== origin && u.protocol.startsWith("http") && u.origin !== rpcAt?.origin, async (route) => {
      const req = route.request();
      if (input.rpc && req.method() === "POST" && (req.postData() ?? "").includes('"jsonrpc"')) {
        const r = await fetch(input.rpc, { method: "POST", headers: { "Content-Type": "application/json" }, body: req.postData() });
        return route.fulfill({ status: r.status, contentType: "application/json", body: await r.text(), headers: { "Access-Control-Allow-Origin": "*" } });
      }
      refused.push(req.url());
      return route.abort();
    });
    if (input.key) {
      const account = privateKeyToAccount(input.key);
      const chainId = "0x" + Number(input.chainId ?? 1337).toString(16);
      await context.exposeBinding("__walletSign", async (_src, typedJSON) => {
        signed++;
        const td = JSON.parse(typedJSON);
        const { EIP712Domain, ...types } = td.types;
        return account.signTypedData({ domain: td.domain, types, primaryType: td.primaryType, message: td.message });
      });
      await context.exposeBinding("__walletRPC", async (_src, body) => {
        const r = await fetch(input.rpc, { method: "POST", headers: { "Content-Type": "application/json" }, body });
        return r.text();
      });
      await context.addInitScript(({ address, chainId }) => {
        const listeners = {};
        let id = 0;
        const provider = {
          isMetaMask: false,
          async request({ method, params }) {
            switch (method) {
              case "eth_requestAccounts":
              case "eth_accounts":
                return [address];
              case "eth_chainId":
                return chainId;
              case "net_version":
                return String(parseInt(chainId, 16));
              case "wallet_switchEthereumChain":
              case "wallet_addEthereumChain":
                return null;
              case "wallet_requestPermissions":
              case "wallet_getPermissions":
                return [{ parentCapability: "eth_accounts" }];
              case "eth_signTypedData_v4": {
                const [from, data] = params;
                if (from.toLowerCase() !== address.toLowerCase()) throw new Error("unknown account " + from);
                return window.__walletSign(typeof data === "string" ? data : JSON.stringify(data));
              }
              default: {
                const res = JSON.parse(await window.__walletRPC(JSON.stringify({ jsonrpc: "2.0", id: ++id, method, params: params ?? [] })));
                if (res.error) throw Object.assign(new Error(res.error.message), { code: res.error.code });
                return res.result;
              }
            }
          },
          on(ev, fn) { (listeners[ev] ??= []).push(fn); return provider; },
          removeListener(ev, fn) { listeners[ev] = (listeners[ev] ?? []).filter((f) => f !== fn); return provider; },
        };
        window.ethereum = provider;
        const info = { uuid: "5b1a3f0e-0000-4000-8000-000000000402", name: "Devnet Wallet", icon: "data:image/svg+xml,<svg xmlns='http://www.w3.org/2000/svg'/>", rdns: "dev.devnet.wallet" };
        const announce = () => window.dispatchEvent(new CustomEvent("eip6963:announceProvider", { detail: Object.freeze({ info, provider }) }));
        window.addEventListener("eip6963:requestProvider", announce);
        announce();
      }, { address: account.address, chainId });
    }
    if (input.solanaKey) {
      const keyPair = await createKeyPairFromBytes(getBase58Encoder().encode(input.solanaKey));
      const address = await getAddressFromPublicKey(keyPair.publicKey);
      const publicKey = [...getBase58Encoder().encode(address)];
      // The wallet signs in Node: the page hands over the wire bytes of a
      // transaction (base64) and gets them back with this key's signature
      // added; the fee payer's slot stays empty for the facilitator.
      await context.exposeBinding("__solanaSign", async (_src, b64, chain) => {
        chains.push(chain);
        if (chain !== "solana:devnet") throw new Error(`this wallet signs on solana:devnet only, not ${chain}`);
        const tx = getTransactionDecoder().decode(Buffer.from(b64, "base64"));
        const out = await partiallySignTransaction([keyPair], tx);
        signed++;
        return Buffer.from(getTransactionEncoder().encode(out)).toString("base64");
      });
      await context.addInitScript(({ address, publicKey }) => {
        const chain = "solana:devnet";
        const account = Object.freeze({
          address, publicKey: new Uint8Array(publicKey), chains: [chain],
          features: ["solana:signTransaction"], label: "Devnet buyer",
        });
        const listeners = { change: [] };
        let authorised = false;
        const b64 = (bytes) => btoa(String.fromCharCode(...bytes));
        const unb64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
        const wallet = {
          version: "1.0.0",
          name: "Devnet Wallet",
          icon: "data:image/svg+xml;base64," + btoa("<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 1 1'/>"),
          chains: [chain],
          get accounts() { return authorised ? [account] : []; },
          features: {
            "standard:connect": {
              version: "1.0.0",
              async connect({ silent } = {}) {
                if (!silent && !authorised) {
                  authorised = true;
                  listeners.change.forEach((f) => f({ accounts: wallet.accounts }));
                }
                return { accounts: wallet.accounts };
              },
            },
            "standard:disconnect": {
              version: "1.0.0",
              async disconnect() {
                authorised = false;
                listeners.change.forEach((f) => f({ accounts: [] }));
              },
            },
            "standard:events": {
              version: "1.0.0",
              on(event, fn) {
                (listeners[event] ??= []).push(fn);
                return () => { listeners[event] = listeners[event].filter((f) => f !== fn); };
              },
            },
            "solana:signTransaction": {
              version: "1.0.0",
              supportedTransactionVersions: ["legacy", 0],
              async signTransaction(...inputs) {
                const out = [];
                for (const { account: a, transaction, chain: c } of inputs) {
                  if (!authorised || a?.address !== address) throw new Error("account not connected: " + a?.address);
                  out.push({ signedTransaction: unb64(await window.__solanaSign(b64(transaction), c ?? "")) });
                }
                return out;
              },
            },
          },
        };
        // As @wallet-standard/wallet's registerWallet: announce the wallet to
        // an app already listening, and answer the app's ready event.
        const callback = ({ register }) => register(wallet);
        window.dispatchEvent(new CustomEvent("wallet-standard:register-wallet", { detail: callback }));
        window.addEventListener("wallet-standard:app-ready", ({ detail }) => callback(detail));
      }, { address, publicKey });
    }
    const page = await context.newPage();
    page.on("console", (msg) => { if (msg.type() === "error") consoleErrors.push(msg.text()); });
    page.on("pageerror", (err) => consoleErrors.push(String(err)));

    const resp = await page.goto(input.url, { waitUntil: "load" });
    await page.waitForSelector(".container .title", { timeout: 30000 });
    await page.waitForTimeout(500);
    const text = await page.locator("body").innerText();
    let paid = "", balance = "";
    if (input.key || input.solanaKey) {
      const pay = page.getByRole("button", { name: "Pay now" });
      const select = page.locator("select.input");
      await select.or(pay).first().waitFor({ timeout: 30000 });
      if (await select.isVisible()) {
        // The wallet list fills in as wallets announce themselves.
        await page.waitForFunction(() => document.querySelectorAll("select.input option").length > 1, null, { timeout: 15000 }).catch(() => {});
        const options = await select.locator("option").evaluateAll((os) => os.map((o) => ({ value: o.value, text: o.textContent })));
        const wallet = options.find((o) => /devnet wallet/i.test(o.text)) ?? options.find((o) => /injected/i.test(o.text) || o.value === "injected");
        if (!wallet) throw new Error("no injected wallet offered: " + JSON.stringify(options) + "; the page says: " + await page.locator("body").innerText());
        await select.selectOption(wallet.value);
        await page.getByRole("button", { name: "Connect wallet" }).click();
      }
      await pay.waitFor({ timeout: 30000 });
      // The person reveals the balance the page read from the chain.
      const shown = page.locator("button.balance-button");
      if (await shown.count()) {
        await shown.click();
        await page.waitForFunction(() => /\$\d/.test(document.querySelector("button.balance-button")?.textContent ?? ""), null, { timeout: 15000 }).catch(() => {});
        balance = await shown.innerText();
      }
      await pay.click();
      await page.waitForURL((u) => u.protocol === "blob:" || !u.href.startsWith(input.url), { timeout: 60000 }).catch(async () => {
        throw new Error("the page did not show the content; it says: " + await page.locator("body").innerText());
      });
      paid = await page.locator("body").innerText();
    }
    const encoding = (await resp.headerValue("content-encoding")) ?? "";
    process.stdout.write(JSON.stringify({ status: resp.status(), encoding, text, paid, balance, offPageRequests, refused, signed, chains, consoleErrors }) + "\n");
  } finally {
    await browser.close();
  }
} catch (e) {
  fail(e);
}
