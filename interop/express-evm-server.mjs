// A seller's server built with the official @x402/express middleware,
// charging for GET /paid on an EVM network the official packages know no
// default asset for (a devnet), configured from the facilitator's GET
// /supported alone: the kind's extra names the asset, its decimals and
// EIP-712 name and version. Env: FACILITATOR_URL, PAY_TO, NETWORK (CAIP-2,
// default eip155:1337), PRICE (default $0.01). Prints {"url": …,
// "extra": {…}} once listening; exits when stdin closes.
import express from "express";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme } from "@x402/evm/exact/server";
import { parseUnits } from "viem";

const network = process.env.NETWORK || "eip155:1337";
const facilitator = new HTTPFacilitatorClient({ url: process.env.FACILITATOR_URL });
const supported = await facilitator.getSupported();
const kind = supported.kinds.find((k) => k.scheme === "exact" && k.network === network);
if (!kind?.extra?.asset) {
  process.stderr.write(`no exact kind with an asset for ${network}: ${JSON.stringify(supported)}\n`);
  process.exit(1);
}
const { asset, decimals, name, version } = kind.extra;
const scheme = new ExactEvmScheme().registerMoneyParser(async (amount) => ({
  amount: parseUnits(String(amount), decimals).toString(),
  asset,
  extra: { name, version },
}));
const server = new x402ResourceServer(facilitator).register(network, scheme);
const app = express();
app.use(paymentMiddleware({
  "GET /paid": { accepts: [{ scheme: "exact", price: process.env.PRICE || "$0.01", network, payTo: process.env.PAY_TO }], description: "paid content" },
}, server));
app.get("/paid", (_req, res) => res.json({ paid_content: true }));
const listener = app.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${listener.address().port}`, extra: kind.extra }) + "\n");
});
process.stdin.on("end", () => listener.close(() => process.exit(0)));
process.stdin.resume();
