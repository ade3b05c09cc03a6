// The official Solana facilitator logic (x402Facilitator + @x402/svm's exact
// scheme) behind a minimal node:http server: POST /verify, POST /settle,
// GET /supported. Env: RPC_URL (the chain's JSON-RPC), SECRET_KEY (the fee
// payer's base58 64-byte secret key), NETWORK (CAIP-2, default Solana
// devnet). Prints {"url": …, "feePayer": …} once listening; exits when
// stdin closes.
import http from "node:http";
import { x402Facilitator } from "@x402/core/facilitator";
import { registerExactSvmScheme } from "@x402/svm/exact/facilitator";
import { toFacilitatorSvmSigner } from "@x402/svm";
import { createKeyPairSignerFromBytes, getBase58Encoder } from "@solana/kit";

const network = process.env.NETWORK || "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1";
const keypair = await createKeyPairSignerFromBytes(getBase58Encoder().encode(process.env.SECRET_KEY));
const facilitator = new x402Facilitator();
registerExactSvmScheme(facilitator, { signer: toFacilitatorSvmSigner(keypair, { defaultRpcUrl: process.env.RPC_URL }), networks: network });

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
  process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${server.address().port}`, feePayer: keypair.address }) + "\n");
});
process.stdin.on("end", () => server.close(() => process.exit(0)));
process.stdin.resume();
