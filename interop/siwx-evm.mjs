// Signs a sign-in-with-x proof with the official @x402/extensions 2.27
// client (createSIWxPayload + encodeSIWxHeader) and an EVM wallet (a viem
// account), as a buyer's agent would answer a 402's challenge. Input on
// stdin: {"privateKey": "0x…", "chainId": "eip155:…", "info": {…the
// challenge's info…}, "url": the request URL}.
// Output: {"header": "<SIGN-IN-WITH-X value>", "payload": {…}}.
import { createSIWxPayload, encodeSIWxHeader } from "@x402/extensions/sign-in-with-x";
import { privateKeyToAccount } from "viem/accounts";
import { readStdinJSON, fail } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const account = privateKeyToAccount(input.privateKey);
  const payload = await createSIWxPayload({ ...input.info, chainId: input.chainId, type: "eip191" }, account, input.url);
  process.stdout.write(JSON.stringify({ header: encodeSIWxHeader(payload), payload }) + "\n");
} catch (e) {
  fail(e);
}
