// Signs a sign-in-with-x proof with the official @x402/extensions 2.27
// client (createSIWxPayload + encodeSIWxHeader) and a Solana wallet (a
// @solana/kit key pair signer), as a buyer's agent would answer a 402's
// challenge. Input on stdin: {"secretKey": base58 64 bytes, "chainId":
// "solana:…", "info": {…the challenge's info…}, "url": the request URL}.
// Output: {"header": "<SIGN-IN-WITH-X value>", "payload": {…}}.
import { createSIWxPayload, encodeSIWxHeader } from "@x402/extensions/sign-in-with-x";
import { createKeyPairSignerFromBytes, getBase58Encoder } from "@solana/kit";
import { readStdinJSON, fail } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const signer = await createKeyPairSignerFromBytes(getBase58Encoder().encode(input.secretKey));
  const payload = await createSIWxPayload({ ...input.info, chainId: input.chainId, type: "ed25519" }, signer, input.url);
  process.stdout.write(JSON.stringify({ header: encodeSIWxHeader(payload), payload }) + "\n");
} catch (e) {
  fail(e);
}
