// The official facilitator logic (x402Facilitator + @x402/evm's exact scheme)
// behind a minimal node:http server: POST /verify, POST /settle, GET /supported.
// No HTTP server ships with @x402/core, so this is the whole wrapper.
// Env: RPC_URL (JSON-RPC of the chain), PRIVATE_KEY (relayer), NETWORK
// (CAIP-2, default eip155:1337). Prints {"url": "http://127.0.0.1:<port>"}
// once listening; exits when stdin closes.
import { x402Facilitator } from "@x402/core/facilitator";
import { serveFacilitator } from "./lib.mjs";
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

serveFacilitator(facilitator);
