// The official bazaar helpers of @x402/extensions 2.27 against our
// gateway: lists a facilitator's discovery resources with
// withBazaar(HTTPFacilitatorClient).listResources(params) for each of
// "lists", and checks each of "extensions" (bazaar extensions as a 402 or
// the /.well-known/x402 manifest carries them) with
// validateDiscoveryExtension and validateDiscoveryExtensionSpec, and for
// each of "payments" ({url, extension}: what a paying client sends) reads
// what a facilitator catalogs with extractDiscoveryInfo. Input on stdin:
// {"facilitatorURL": …, "facilitatorToken"?: …, "lists": [params…], "extensions": [ext…],
// "payments": [{url, extension}…]}. Output: {"pages": [response…],
// "validations": [{valid, errors?, spec: {valid, errors?}}…], "extracted":
// [{resourceUrl, method?, toolName?} | null…]}.
import {
  withBazaar,
  validateDiscoveryExtension,
  validateDiscoveryExtensionSpec,
  extractDiscoveryInfo,
} from "@x402/extensions/bazaar";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { readStdinJSON, fail } from "./lib.mjs";

try {
  const input = await readStdinJSON();
  const pages = [];
  if (input.facilitatorURL) {
    // A facilitator that requires a bearer token (the operator's own
    // callers only) gets it on every path, the list's included.
    const auth = input.facilitatorToken && { Authorization: `Bearer ${input.facilitatorToken}` };
    const createAuthHeaders = auth && (async () => ({ verify: auth, settle: auth, supported: auth, bazaar: auth }));
    const client = withBazaar(new HTTPFacilitatorClient({ url: input.facilitatorURL, createAuthHeaders }));
    for (const params of input.lists ?? []) pages.push(await client.extensions.bazaar.listResources(params));
  }
  const validations = (input.extensions ?? []).map((ext) => ({
    ...validateDiscoveryExtension(ext),
    spec: validateDiscoveryExtensionSpec(ext),
  }));
  const extracted = (input.payments ?? []).map(({ url, extension }) => {
    const info = extractDiscoveryInfo({ x402Version: 2, resource: { url }, extensions: { bazaar: extension } }, {});
    return info && { resourceUrl: info.resourceUrl, method: info.method, toolName: info.toolName };
  });
  process.stdout.write(JSON.stringify({ pages, validations, extracted }) + "\n");
} catch (e) {
  fail(e);
}
