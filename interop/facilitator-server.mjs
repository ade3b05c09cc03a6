// The official facilitator logic (x402Facilitator + @x402/evm's exact scheme)
// behind a minimal node:http server: POST /verify, POST /settle, GET /supported.
// No HTTP server ships with @x402/core, so this is the whole wrapper.
// Env: RPC_URL (JSON-RPC of the chain), PRIVATE_KEY (relayer), NETWORK
// (CAIP-2, default eip155:1337). Prints {"url": "http://127.0.0.1:<port>"}
// once listening; exits when stdin closes.
import http from "node:http";
import { x402Facilitator } from "@x402/core/facilitator";
import { registerExactEvmScheme } from "@x402/evm/exact/facilitator";
import { toFacilitatorEvmSigner } from "@x402/evm";
import { createWalletClient, defineChain, http as viemHttp, publicActions } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const network = process.env.NETWORK || "eip155:1337";
const chain = defineChain({
  id: Number(network.split(":")[1]),
  name: "devnet",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [process.env.RPC_URL] } },
});
const account = privateKeyToAccount(process.env.PRIVATE_KEY);
const wallet = createWalletClient({ account, chain, transport: viemHttp(process.env.RPC_URL) }).extend(publicActions);
const facilitator = new x402Facilitator();
registerExactEvmScheme(facilitator, { signer: toFacilitatorEvmSigner({ ...wallet, address: account.address }), networks: network });

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
  process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${server.address().port}` }) + "\n");
});
process.stdin.on("end", () => server.close(() => process.exit(0)));
process.stdin.resume();
