// The official Solana client scheme (@x402/svm's ExactSvmScheme) for the
// interop scripts, pointed at a chosen RPC (the local litesvm chain).
// registerExactSvmScheme takes no RPC URL, so the scheme is registered by
// hand exactly as it does, with the config the class accepts.
import { ExactSvmScheme } from "@x402/svm/exact/client";
import { createKeyPairSignerFromBytes, getBase58Encoder } from "@solana/kit";

// registerSvm makes client pay on every solana:* network from the wallet
// whose base58 64-byte secret key is secretKey, reading the chain at rpcUrl.
export async function registerSvm(client, { secretKey, rpcUrl }) {
  const signer = await createKeyPairSignerFromBytes(getBase58Encoder().encode(secretKey));
  client.register("solana:*", new ExactSvmScheme(signer, { rpcUrl }));
  return signer;
}
