// Shared helpers of the interop scripts.
export async function readStdinJSON() {
  let data = "";
  for await (const chunk of process.stdin) data += chunk;
  return JSON.parse(data);
}

export function fail(e) {
  process.stderr.write(`${e?.stack ?? e}\n`);
  process.exit(1);
}
