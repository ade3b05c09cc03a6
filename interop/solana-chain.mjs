// A Solana chain on one machine: the litesvm runtime (Agave's SVM with the
// System, SPL Token, Token-2022, Associated Token Account, Memo and
// ComputeBudget programs built in) behind the subset of Solana JSON-RPC that
// the official @x402/svm client and facilitator and the Go facilitator call.
//
// It answers the devnet genesis hash and keeps a USDC mint (6 decimals) at
// the devnet USDC address, so clients treat it as solana-devnet. It funds
// with 100 SOL the development fee payer and the fee payers it is told about
// (FUND_SOL, comma-separated base58 addresses), gives USDC to FUND_USDC
// ("address:atomicAmount,..."), and funds DEV_WALLETS (default 4) test
// wallets with 10 SOL and 1,000 USDC each. The development keys are derived
// from public seeds (devKey below): development only.
//
// litesvm keeps its state in memory only: the chain is reset on restart.
//
// Listens on $HOST:$PORT (default 127.0.0.1, 0 = a free port) and prints
// one JSON line {"url", "usdc", "feePayer", "wallets"} when ready.
//
// Test helpers (not Solana methods): aov_setTokenBalance [owner, mint,
// amount, tokenProgram?], aov_createMint [address, decimals, tokenProgram?],
// aov_airdrop [address, lamports], aov_setAccount [address, owner, base64
// data] (rent-exempt), aov_expireBlockhash [], aov_advanceClock [seconds].
//
// The chain's clock is the wall clock, as a cluster's is (a bank's Clock
// sysvar and a block's blockTime are the validators' estimate of the wall
// time): litesvm's own never moves (its unix_timestamp stays 0), so every
// request first sets it (syncClock), and a landed transaction's blockTime
// is the same reading. aov_advanceClock moves the chain's clock on by that
// many seconds from then on (a test that needs the chain to have aged
// without waiting for it).
import http from "node:http";
import { fstatSync } from "node:fs";
import { createHash, createPrivateKey, createPublicKey } from "node:crypto";
import { LiteSVM } from "litesvm";
import { getAddressCodec, getBase58Decoder, getBase58Encoder, getProgramDerivedAddress } from "@solana/kit";

const TOKEN = "TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA";
const TOKEN_2022 = "TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb";
const ATA = "ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL";
const SYSTEM = "11111111111111111111111111111111";
const USDC_DEVNET = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU";
const DEVNET_GENESIS = "EtWTRABZaYq6iMfeYKouRu166VU2xqa1wcaWoxPkrZBG";

const addr = getAddressCodec();
const b58enc = getBase58Encoder(); // string -> bytes
const b58dec = getBase58Decoder(); // bytes -> string

const svm = new LiteSVM();
// signature (base58) -> {slot, err, blockTime, bytes}: every transaction
// that landed (succeeded or failed in a program).
const statuses = new Map();
// account (base58) -> signatures of the landed transactions whose static
// account keys include it, oldest first (getSignaturesForAddress).
const byAccount = new Map();
// Blockhashes this chain has handed out, and whether they are still valid.
const blockhashes = new Map();
let slot = 1n;
// clockOffset: seconds the chain's clock runs ahead of the wall clock
// (aov_advanceClock).
let clockOffset = 0;
function unixNow() {
  return Math.floor(Date.now() / 1000) + clockOffset;
}
function syncClock() {
  const c = svm.getClock();
  c.unixTimestamp = BigInt(unixNow());
  svm.setClock(c);
}
function latest() {
  const bh = svm.latestBlockhash();
  if (!blockhashes.has(bh)) blockhashes.set(bh, { valid: true, lastValidBlockHeight: slot + 150n });
  return { blockhash: bh, lastValidBlockHeight: blockhashes.get(bh).lastValidBlockHeight };
}

function u64le(v) {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(v));
  return b;
}

function mintData(decimals) {
  // COption<Pubkey> mint authority (none: balances are set directly), u64
  // supply, u8 decimals, bool initialized, COption<Pubkey> freeze authority.
  return Buffer.concat([
    Buffer.alloc(36),
    u64le(0), Buffer.from([decimals, 1]),
    Buffer.from([0, 0, 0, 0]), Buffer.alloc(32),
  ]);
}

function tokenAccountData(mint, owner, amount) {
  // mint, owner, u64 amount, COption delegate, state, COption isNative, u64 delegated, COption close authority.
  return Buffer.concat([
    Buffer.from(addr.encode(mint)), Buffer.from(addr.encode(owner)), u64le(amount),
    Buffer.alloc(36), Buffer.from([1]), Buffer.alloc(12), u64le(0), Buffer.alloc(36),
  ]);
}

function setAccount(address, owner, data, lamports) {
  svm.setAccount({
    address,
    lamports: lamports ?? svm.minimumBalanceForRentExemption(BigInt(data.length)),
    data: new Uint8Array(data),
    programAddress: owner,
    executable: false,
  });
}

async function ataOf(owner, mint, tokenProgram) {
  const [pda] = await getProgramDerivedAddress({
    programAddress: ATA,
    seeds: [addr.encode(owner), addr.encode(tokenProgram), addr.encode(mint)],
  });
  return pda;
}

function createMint(address, decimals, tokenProgram) {
  setAccount(address, tokenProgram, mintData(decimals));
}

async function setTokenBalance(owner, mint, amount, tokenProgram) {
  const ata = await ataOf(owner, mint, tokenProgram);
  setAccount(ata, tokenProgram, tokenAccountData(mint, owner, amount));
  return ata;
}

function airdrop(address, lamports) {
  const acc = svm.getAccount(address);
  const have = acc.exists ? BigInt(acc.lamports) : 0n;
  svm.setAccount({
    address,
    lamports: have + BigInt(lamports),
    data: acc.exists ? acc.data : new Uint8Array(),
    programAddress: acc.exists ? acc.programAddress : SYSTEM,
    executable: acc.exists ? acc.executable : false,
  });
}

// devKey derives a public development key: its ed25519 seed is
// sha256(text). For development only: anyone can compute it.
function devKey(text) {
  const seed = createHash("sha256").update(text).digest();
  const priv = createPrivateKey({ key: Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), seed]), format: "der", type: "pkcs8" });
  const pub = createPublicKey(priv).export({ format: "der", type: "spki" }).subarray(12);
  return { address: b58dec.decode(pub), secretKey: b58dec.decode(Buffer.concat([seed, pub])), seedHex: seed.toString("hex") };
}
// The test wallets: wallet i is devKey(DEV_WALLET_SEED + i).
const DEV_WALLET_SEED = "aov solana devnet wallet ";
const DEV_FEE_PAYER_SEED = "aov solana devnet fee payer";
function devWallets(n) {
  return Array.from({ length: n }, (_, i) => devKey(`${DEV_WALLET_SEED}${i}`));
}

function parseTokenAccount(data) {
  const b = Buffer.from(data);
  return { mint: b58dec.decode(b.subarray(0, 32)), owner: b58dec.decode(b.subarray(32, 64)), amount: b.readBigUInt64LE(64) };
}

function decimalsOf(mint) {
  const acc = svm.getAccount(mint);
  if (!acc.exists || acc.data.length < 82) return 0;
  return acc.data[44];
}

function encodeAccount(address, encoding) {
  const acc = svm.getAccount(address);
  if (!acc.exists) return null;
  const base = { lamports: Number(acc.lamports), owner: acc.programAddress, executable: acc.executable, rentEpoch: 0, space: acc.data.length };
  const isToken = acc.programAddress === TOKEN || acc.programAddress === TOKEN_2022;
  if (encoding === "jsonParsed" && isToken && (acc.data.length === 82 || acc.data.length >= 165)) {
    const program = acc.programAddress === TOKEN ? "spl-token" : "spl-token-2022";
    if (acc.data.length === 82) {
      const d = Buffer.from(acc.data);
      return { ...base, data: { program, space: 82, parsed: { type: "mint", info: {
        mintAuthority: d.readUInt32LE(0) ? b58dec.decode(d.subarray(4, 36)) : null,
        supply: d.readBigUInt64LE(36).toString(), decimals: d[44], isInitialized: d[45] === 1,
        freezeAuthority: d.readUInt32LE(46) ? b58dec.decode(d.subarray(50, 82)) : null } } } };
    }
    const t = parseTokenAccount(acc.data);
    const decimals = decimalsOf(t.mint);
    return { ...base, data: { program, space: acc.data.length, parsed: { type: "account", info: {
      mint: t.mint, owner: t.owner, state: "initialized", isNative: false,
      tokenAmount: tokenAmount(t.amount, decimals) } } } };
  }
  return { ...base, data: [Buffer.from(acc.data).toString("base64"), "base64"] };
}

function tokenAmount(amount, decimals) {
  const s = amount.toString().padStart(decimals + 1, "0");
  const ui = decimals ? `${s.slice(0, -decimals)}.${s.slice(-decimals)}`.replace(/\.?0+$/, "") : s;
  return { amount: amount.toString(), decimals, uiAmount: Number(ui), uiAmountString: ui };
}

function txBytes(encoded, encoding) {
  return encoding === "base58" ? Buffer.from(b58enc.encode(encoded)) : Buffer.from(encoded, "base64");
}

// shortvec length prefix; returns [value, bytesRead].
function shortvec(b, off) {
  let v = 0, i = 0;
  for (;;) {
    const c = b[off + i];
    v |= (c & 0x7f) << (7 * i);
    i++;
    if ((c & 0x80) === 0) return [v, i];
  }
}

function firstSignature(b) {
  const [n, k] = shortvec(b, 0);
  if (n < 1) throw rpcError(-32602, "transaction has no signatures");
  return b58dec.decode(b.subarray(k, k + 64));
}

function messageBlockhash(b) {
  let [n, k] = shortvec(b, 0);
  let off = k + 64 * n;
  if (b[off] & 0x80) off++; // versioned
  off += 3;
  const [keys, kk] = shortvec(b, off);
  off += kk + 32 * keys;
  return b58dec.decode(b.subarray(off, off + 32));
}

// The static account keys of a wire transaction, and whether it is v0.
function accountKeys(b) {
  const [n, k] = shortvec(b, 0);
  let off = k + 64 * n;
  const versioned = (b[off] & 0x80) !== 0;
  if (versioned) off++;
  off += 3;
  const [keys, kk] = shortvec(b, off);
  off += kk;
  const out = [];
  for (let i = 0; i < keys; i++) out.push(b58dec.decode(b.subarray(off + 32 * i, off + 32 * (i + 1))));
  return { keys: out, versioned };
}

// getSignaturesForAddress [address, {limit, before, until}]: newest first,
// at most limit (default and cap 1000), starting after `before` and
// stopping before `until` (signatures this chain does not know start or
// stop nothing).
function signaturesFor(address, cfg) {
  const limit = cfg?.limit ?? 1000;
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw rpcError(-32602, "Invalid limit; max 1000");
  const sigs = byAccount.get(address) ?? [];
  let end = sigs.length;
  if (cfg?.before) {
    const i = sigs.indexOf(cfg.before);
    if (i >= 0) end = i;
  }
  const out = [];
  for (let i = end - 1; i >= 0 && out.length < limit; i--) {
    if (cfg?.until && sigs[i] === cfg.until) break;
    const st = statuses.get(sigs[i]);
    out.push({ signature: sigs[i], slot: st.slot, err: st.err, memo: null, blockTime: st.blockTime, confirmationStatus: "finalized" });
  }
  return out;
}

function run(bytes, simulate) {
  const versioned = (() => {
    const [n, k] = shortvec(bytes, 0);
    return (bytes[k + 64 * n] & 0x80) !== 0;
  })();
  if (simulate) return versioned ? svm.inner.simulateVersionedTransaction(bytes) : svm.inner.simulateLegacyTransaction(bytes);
  return versioned ? svm.inner.sendVersionedTransaction(bytes) : svm.inner.sendLegacyTransaction(bytes);
}

// errOf is a failed result's error in the JSON-RPC shape; an instruction's
// error is {"InstructionError": [index, {"Custom": code} | name]}, as a
// node reports it (litesvm's error objects serialize to nothing).
function errOf(res) {
  if (typeof res.err !== "function") return null;
  const e = res.err();
  if (e && typeof e === "object" && typeof e.err === "function" && typeof e.index === "number") {
    const ie = e.err();
    const inner = ie && typeof ie === "object" && "code" in ie ? { Custom: Number(ie.code) }
      : ie && typeof ie === "object" && "msg" in ie ? { BorshIoError: String(ie.msg) } : String(ie);
    return { InstructionError: [e.index, inner] };
  }
  // A fieldless error is a number in litesvm (a const enum, not exported
  // at run time); a node names it: "AlreadyProcessed", "BlockhashNotFound".
  if (typeof e === "number" && FIELDLESS[e]) return FIELDLESS[e];
  // The variants carrying an account index, as a node spells them:
  // {"InsufficientFundsForRent":{"account_index":0}}.
  const indexed = e?.constructor?.name?.replace(/^TransactionError/, "");
  if (typeof e?.accountIndex === "number" && ["InsufficientFundsForRent", "ProgramExecutionTemporarilyRestricted"].includes(indexed)) {
    return { [indexed]: { account_index: e.accountIndex } };
  }
  return JSON.parse(JSON.stringify({ TransactionError: e ?? String(res) }, (_, v) => (typeof v === "bigint" ? v.toString() : v)));
}

// litesvm's TransactionErrorFieldless, in its order (Agave's TransactionError).
const FIELDLESS = ["AccountInUse", "AccountLoadedTwice", "AccountNotFound", "ProgramAccountNotFound",
  "InsufficientFundsForFee", "InvalidAccountForFee", "AlreadyProcessed", "BlockhashNotFound", "CallChainTooDeep",
  "MissingSignatureForFee", "InvalidAccountIndex", "SignatureFailure", "InvalidProgramForExecution", "SanitizeFailure",
  "ClusterMaintenance", "AccountBorrowOutstanding", "WouldExceedMaxBlockCostLimit", "UnsupportedVersion",
  "InvalidWritableAccount", "WouldExceedMaxAccountCostLimit", "WouldExceedAccountDataBlockLimit", "TooManyAccountLocks",
  "AddressLookupTableNotFound", "InvalidAddressLookupTableOwner", "InvalidAddressLookupTableData",
  "InvalidAddressLookupTableIndex", "InvalidRentPayingAccount", "WouldExceedMaxVoteCostLimit",
  "WouldExceedAccountDataTotalLimit", "MaxLoadedAccountsDataSizeExceeded", "ResanitizationNeeded",
  "InvalidLoadedAccountsDataSizeLimit", "UnbalancedTransaction", "ProgramCacheHitMaxLimit", "CommitCancelled"];

function metaOf(res) {
  const m = typeof res.meta === "function" ? res.meta() : res;
  return { logs: m.logs(), unitsConsumed: Number(m.computeUnitsConsumed()) };
}

function rpcError(code, message, data) {
  const e = new Error(message);
  e.rpc = { code, message, ...(data ? { data } : {}) };
  return e;
}

const ctx = () => ({ slot: Number(slot), apiVersion: "2.2.0" });

const methods = {
  getHealth: () => "ok",
  getVersion: () => ({ "solana-core": "2.2.0", "feature-set": 0 }),
  getGenesisHash: () => DEVNET_GENESIS,
  getSlot: () => Number(slot),
  getBlockHeight: () => Number(slot),
  getLatestBlockhash: () => ({ context: ctx(), value: { blockhash: latest().blockhash, lastValidBlockHeight: Number(latest().lastValidBlockHeight) } }),
  isBlockhashValid: ([bh]) => ({ context: ctx(), value: (latest(), blockhashes.get(bh)?.valid === true) }),
  getMinimumBalanceForRentExemption: ([len]) => Number(svm.minimumBalanceForRentExemption(BigInt(len))),
  getBalance: ([a]) => ({ context: ctx(), value: Number(svm.getBalance(a) ?? 0n) }),
  getAccountInfo: ([a, cfg]) => ({ context: ctx(), value: encodeAccount(a, cfg?.encoding ?? "base64") }),
  getMultipleAccounts: ([as, cfg]) => ({ context: ctx(), value: as.map((a) => encodeAccount(a, cfg?.encoding ?? "base64")) }),
  getTokenAccountBalance: ([a]) => {
    const acc = svm.getAccount(a);
    if (!acc.exists || acc.data.length < 165) throw rpcError(-32602, "Invalid param: could not find account");
    const t = parseTokenAccount(acc.data);
    return { context: ctx(), value: tokenAmount(t.amount, decimalsOf(t.mint)) };
  },
  simulateTransaction: ([encoded, cfg]) => {
    const bytes = txBytes(encoded, cfg?.encoding);
    const sigVerify = cfg?.sigVerify === true;
    if (cfg?.replaceRecentBlockhash) {
      if (sigVerify) throw rpcError(-32602, "sigVerify may not be used with replaceRecentBlockhash");
      const [n, k] = shortvec(bytes, 0);
      let off = k + 64 * n;
      if (bytes[off] & 0x80) off++;
      off += 3;
      const [keys, kk] = shortvec(bytes, off);
      off += kk + 32 * keys;
      Buffer.from(b58enc.encode(latest().blockhash)).copy(bytes, off);
    }
    const before = svm.inner.getSigverify();
    svm.inner.setSigverify(sigVerify);
    let res;
    try {
      res = run(bytes, true);
    } finally {
      svm.inner.setSigverify(before);
    }
    const err = errOf(res);
    return { context: ctx(), value: { err, ...metaOf(res), accounts: null, returnData: null,
      ...(cfg?.replaceRecentBlockhash ? { replacementBlockhash: { blockhash: latest().blockhash, lastValidBlockHeight: Number(latest().lastValidBlockHeight) } } : {}) } };
  },
  sendTransaction: ([encoded, cfg]) => {
    const bytes = txBytes(encoded, cfg?.encoding ?? "base58");
    const sig = firstSignature(bytes);
    if (statuses.has(sig)) throw rpcError(-32002, "Transaction simulation failed: This transaction has already been processed", { err: "AlreadyProcessed", logs: [] });
    const bh = messageBlockhash(bytes);
    if (blockhashes.has(bh) && !blockhashes.get(bh).valid) throw rpcError(-32002, "Transaction simulation failed: Blockhash not found", { err: "BlockhashNotFound", logs: [] });
    if (!cfg?.skipPreflight) {
      const sim = run(bytes, true);
      const err = errOf(sim);
      if (err) throw rpcError(-32002, "Transaction simulation failed", { err, ...metaOf(sim) });
    }
    const res = run(bytes, false);
    const err = errOf(res);
    // A transaction that fails for want of a fee payer, a signature or a
    // valid blockhash never lands; one that fails in a program does (and
    // pays its fee).
    const landed = !err || JSON.stringify(err).includes("InstructionError");
    if (!landed) throw rpcError(-32002, "Transaction simulation failed", { err, ...metaOf(res) });
    slot += 1n;
    statuses.set(sig, { slot: Number(slot), err, blockTime: unixNow(), bytes: Buffer.from(bytes) });
    for (const a of new Set(accountKeys(bytes).keys)) {
      if (!byAccount.has(a)) byAccount.set(a, []);
      byAccount.get(a).push(sig);
    }
    return sig;
  },
  getSignatureStatuses: ([sigs]) => ({ context: ctx(), value: sigs.map((s) => {
    const st = statuses.get(s);
    return st ? { slot: st.slot, confirmations: null, err: st.err, status: st.err ? { Err: st.err } : { Ok: null }, confirmationStatus: "finalized" } : null;
  }) }),
  // With encoding base64 (or base58) the landed wire transaction; other
  // encodings are not served (transaction null). A v0 transaction needs
  // maxSupportedTransactionVersion, as on a real node.
  getTransaction: ([s, cfg]) => {
    const st = statuses.get(s);
    if (!st) return null;
    const { versioned } = accountKeys(st.bytes);
    if (versioned && cfg?.maxSupportedTransactionVersion === undefined) {
      throw rpcError(-32015, "Transaction version (0) is not supported by the requesting client. Please try the request again with the following configuration parameter: \"maxSupportedTransactionVersion\": 0");
    }
    const enc = cfg?.encoding;
    const transaction = enc === "base64" ? [st.bytes.toString("base64"), "base64"] : enc === "base58" ? [b58dec.decode(st.bytes), "base58"] : null;
    return { slot: st.slot, blockTime: st.blockTime, meta: { err: st.err, fee: 5000, status: st.err ? { Err: st.err } : { Ok: null } }, transaction, version: versioned ? 0 : "legacy" };
  },
  getSignaturesForAddress: ([a, cfg]) => signaturesFor(a, cfg),
  aov_createMint: ([address, decimals, program]) => (createMint(address, decimals, program ?? TOKEN), address),
  aov_setTokenBalance: async ([owner, mint, amount, program]) => setTokenBalance(owner, mint, BigInt(amount), program ?? TOKEN),
  aov_airdrop: ([a, lamports]) => (airdrop(a, lamports), null),
  aov_setAccount: ([address, owner, data]) => (setAccount(address, owner, Buffer.from(data, "base64")), null),
  aov_expireBlockhash: () => {
    for (const v of blockhashes.values()) v.valid = false;
    svm.expireBlockhash();
    slot += 151n;
    return latest().blockhash;
  },
  aov_advanceClock: ([seconds]) => {
    if (!Number.isInteger(seconds) || seconds < 0) throw rpcError(-32602, "seconds: a whole number, not negative");
    clockOffset += seconds;
    syncClock();
    return unixNow();
  },
};

async function handle(req) {
  if (req?.jsonrpc !== "2.0" || typeof req.method !== "string") return { jsonrpc: "2.0", id: req?.id ?? null, error: { code: -32600, message: "Invalid request" } };
  const fn = methods[req.method];
  if (!fn) return { jsonrpc: "2.0", id: req.id, error: { code: -32601, message: "Method not found" } };
  syncClock();
  try {
    return { jsonrpc: "2.0", id: req.id, result: await fn(req.params ?? []) };
  } catch (e) {
    return { jsonrpc: "2.0", id: req.id, error: e.rpc ?? { code: -32603, message: String(e.message ?? e) } };
  }
}

// Serialize every request: litesvm is one state machine.
let queue = Promise.resolve();
const server = http.createServer((req, res) => {
  if (req.method !== "POST") {
    res.writeHead(405).end();
    return;
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    queue = queue.then(async () => {
      let body;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch {
        body = null;
      }
      const out = Array.isArray(body) ? await Promise.all(body.map(handle)) : await handle(body);
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(out));
    });
  });
});

createMint(USDC_DEVNET, 6, TOKEN);
// The development fee payer (its key is public, derived from
// DEV_FEE_PAYER_SEED; see the svm facilitator's dev_fee_payer) is always
// funded, so a gateway on this chain can settle out of the box.
for (const a of [devKey(DEV_FEE_PAYER_SEED).address, ...(process.env.FUND_SOL ?? "").split(",").filter(Boolean)]) airdrop(a, 100_000_000_000n);
for (const pair of (process.env.FUND_USDC ?? "").split(",").filter(Boolean)) {
  const [owner, amount] = pair.split(":");
  await setTokenBalance(owner, USDC_DEVNET, BigInt(amount), TOKEN);
}
const wallets = devWallets(Number(process.env.DEV_WALLETS ?? 4));
for (const w of wallets) {
  airdrop(w.address, 10_000_000_000n);
  await setTokenBalance(w.address, USDC_DEVNET, 1_000_000_000n, TOKEN);
}

server.listen(Number(process.env.PORT ?? 0), process.env.HOST ?? "127.0.0.1", () => {
  const { address, port } = server.address();
  process.stdout.write(JSON.stringify({ url: `http://${address}:${port}`, usdc: USDC_DEVNET, feePayer: devKey(DEV_FEE_PAYER_SEED).address, wallets }) + "\n");
});
// Under a test the chain's stdin is a pipe and its end stops the chain;
// started by run.sh (stdin not a pipe) it runs until it is signalled.
if (fstatSync(0).isFIFO()) {
  process.stdin.on("end", () => process.exit(0));
  process.stdin.resume();
}
