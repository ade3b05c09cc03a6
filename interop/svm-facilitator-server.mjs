// The official Solana facilitator logic (x402Facilitator + @x402/svm's exact
// scheme) behind a minimal node:http server: POST /verify, POST /settle,
// GET /supported. Env: RPC_URL (the chain's JSON-RPC), SECRET_KEY (the fee
// payer's base58 64-byte secret key), NETWORK (CAIP-2, default Solana
// devnet). Prints {"url": …, "feePayer": …} once listening; exits when
// stdin closes.
import { x402Facilitator } from "@x402/core/facilitator";
import { serveFacilitator } from "./lib.mjs";
import { registerExactSvmScheme } from "@x402/svm/exact/facilitator";
import { toFacilitatorSvmSigner } from "@x402/svm";
import { createKeyPairSignerFromBytes, getBase58Encoder } from "@solana/kit";

const network = process.env.NETWORK || "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1";
const keypair = await createKeyPairSignerFromBytes(getBase58Encoder().encode(process.env.SECRET_KEY));
const facilitator = new x402Facilitator();
registerExactSvmScheme(facilitator, { signer: toFacilitatorSvmSigner(keypair, { defaultRpcUrl: process.env.RPC_URL }), networks: network });

serveFacilitator(facilitator, { feePayer: keypair.address });
