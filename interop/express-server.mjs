// A seller's server built with the official @x402/express middleware,
// charging for GET /paid on Solana through a facilitator of our choosing
// (HTTPFacilitatorClient). Env: FACILITATOR_URL, PAY_TO (base58), NETWORK
// (CAIP-2, default Solana devnet), PRICE (default $0.01). Prints
// {"url": …} once listening; exits when stdin closes.
import express from "express";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactSvmScheme } from "@x402/svm/exact/server";

const network = process.env.NETWORK || "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1";
const server = new x402ResourceServer(new HTTPFacilitatorClient({ url: process.env.FACILITATOR_URL })).register(network, new ExactSvmScheme());
const app = express();
app.use(paymentMiddleware({
  "GET /paid": { accepts: [{ scheme: "exact", price: process.env.PRICE || "$0.01", network, payTo: process.env.PAY_TO }], description: "paid content" },
}, server));
app.get("/paid", (_req, res) => res.json({ paid_content: true }));
const listener = app.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${listener.address().port}` }) + "\n");
});
process.stdin.on("end", () => listener.close(() => process.exit(0)));
process.stdin.resume();
