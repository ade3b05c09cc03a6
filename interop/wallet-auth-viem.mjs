// Signs wallet proofs with viem, as a buyer's agent using any EIP-4361
// library would: viem's createSiweMessage builds the text and
// account.signMessage signs it (EIP-191 personal_sign). Nothing here comes
// from the gateway's code, so a header it makes passing the gateway shows
// the format is what the documentation says.
//
// Input on stdin:
//   {"kind": "x-wallet-auth", "privateKey": "0x…", "method": "POST",
//    "url": "http://127.0.0.1:8080/verify/schema", "chainId": 8453,
//    "agentId": "seller-7"?, "statement": "…"?, "ttlSeconds": 300?}
// or
//   {"kind": "siwx", "privateKey": "0x…", "chainId": 8453,
//    "info": {domain, uri, version, nonce, issuedAt, expirationTime?,
//             notBefore?, statement?, requestId?, resources?}}
//     (the sign-in-with-x challenge a 402 carries)
// Output on stdout: {"header": "<header value>", "message": "<signed text>"}.
import { privateKeyToAccount } from "viem/accounts";
import { createSiweMessage, generateSiweNonce } from "viem/siwe";
import { readStdinJSON, fail } from "./lib.mjs";

// agentURN percent-encodes every byte outside A–Z a–z 0–9 - . _ ~.
function agentURN(id) {
  const enc = encodeURIComponent(id).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
  return "urn:x-wallet-auth:agent:" + enc;
}

const b64 = (obj) => Buffer.from(JSON.stringify(obj), "utf8").toString("base64");

try {
  const input = await readStdinJSON();
  const account = privateKeyToAccount(input.privateKey);
  if (input.kind === "x-wallet-auth") {
    const u = new URL(input.url);
    const issuedAt = new Date();
    const expirationTime = new Date(issuedAt.getTime() + (input.ttlSeconds ?? 300) * 1000);
    const method = input.method.toUpperCase();
    const resources = ["urn:x-wallet-auth:method:" + method];
    if (input.agentId) resources.push(agentURN(input.agentId));
    const fields = {
      domain: u.host,
      address: account.address,
      uri: `${u.protocol}//${u.host}${u.pathname}`,
      version: "1",
      chainId: input.chainId,
      nonce: generateSiweNonce().slice(0, 64),
      issuedAt,
      expirationTime,
      statement: input.statement,
      resources,
    };
    const message = createSiweMessage(fields);
    const signature = await account.signMessage({ message });
    const envelope = {
      domain: fields.domain,
      address: fields.address,
      uri: fields.uri,
      version: "1",
      chain_id: `eip155:${input.chainId}`,
      nonce: fields.nonce,
      issued_at: issuedAt.toISOString(),
      expiration_time: expirationTime.toISOString(),
      method,
      path: u.pathname,
      type: "eip191",
      signature,
    };
    if (input.statement) envelope.statement = input.statement;
    if (input.agentId) envelope.agent_id = input.agentId;
    process.stdout.write(JSON.stringify({ header: b64(envelope), message }) + "\n");
  } else if (input.kind === "siwx") {
    const info = input.info;
    const message = createSiweMessage({
      domain: info.domain,
      address: account.address,
      statement: info.statement,
      uri: info.uri,
      version: info.version,
      chainId: input.chainId,
      nonce: info.nonce,
      issuedAt: new Date(info.issuedAt),
      expirationTime: info.expirationTime ? new Date(info.expirationTime) : undefined,
      notBefore: info.notBefore ? new Date(info.notBefore) : undefined,
      requestId: info.requestId,
      resources: info.resources,
    });
    const signature = await account.signMessage({ message });
    const proof = {
      domain: info.domain,
      address: account.address,
      statement: info.statement,
      uri: info.uri,
      version: info.version,
      chainId: `eip155:${input.chainId}`,
      type: "eip191",
      nonce: info.nonce,
      issuedAt: info.issuedAt,
      expirationTime: info.expirationTime,
      notBefore: info.notBefore,
      requestId: info.requestId,
      resources: info.resources,
      signature,
    };
    process.stdout.write(JSON.stringify({ header: b64(proof), message }) + "\n");
  } else {
    throw new Error(`unknown kind ${input.kind}`);
  }
} catch (e) {
  fail(e);
}
