package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/verify"
)

const receiptVerifyHelp = `aov receipt verify: check that a receipt was signed by the service and not changed since.

Usage:
  aov receipt verify (--card FILE_OR_URL | --public-key BASE64) [--request FILE] [--context verify|score] RECEIPT_FILE|-

RECEIPT_FILE is the whole JSON response as you received it, "attestation"
included; "-" reads it from standard input (as it does for --card and
--request; one of them at most).

Where the public key comes from (one is required):
  --card FILE_OR_URL   the service's agent card, a saved file or an http(s)
                       URL (fetched with a 10 s timeout). Every key version
                       the service ever used is listed there, so old receipts
                       keep verifying after a key rotation. The receipt names
                       its card in verify.public_key_url; fetch it from an
                       address you trust, not just the one the receipt names.
                       An https URL is never followed to plain http: such a
                       redirect is refused (exit 2), since whoever answers
                       on the plain leg would choose the keys.
  --public-key BASE64  a bare Ed25519 public key (base64 of its 32 bytes),
                       tried for whatever key_version the receipt names.

Optional:
  --request FILE       the request body you sent (or received with the
                       output). Its output_hash, schema_hash, rules_hash and
                       request_hash are recomputed, and with its task_id,
                       agent_id, strict_content_check and enforce_rules
                       must equal the receipt's (a compact receipt has no
                       request_hash): this proves the receipt is about your
                       data.
  --context verify|score
                       what kind of response this is. Default: inferred, a
                       response with an output_hash is a verification
                       (/verify/*), anything else a trust score (/score/*).

What is checked: the Ed25519 signature over the RFC 8785 form of
{context, algorithm, key_version, attested_at, response without
attestation}; that the attestation has only its four members (it is not
signed); that attestation.key_version equals verify.key_version; that
attestation.timestamp is the instant of verified_at, computed_at and
inputs.window.to wherever the receipt has them (a trust score must carry
computed_at), and that a score's inputs.window.from, oldest_evidence_at
and newest_evidence_at are not more than 5 minutes after it (scores signed
before version 3 of the score method could date evidence seconds after);
that the card does not mark the
key compromised at the receipt's time, and that the time lies within the
key's service life (createdAt to retiredAt, 5 minutes either side); with
--request, every hash and the four request members above.

Output and exit status:
  valid              (exit 0) everything checked holds
  invalid: REASON    (exit 1) the receipt does not hold, and why
  error: REASON      (exit 2) could not check: bad flags, unreadable file,
                     card not reachable, or the input is an error response
                     or a demand for payment instead of a receipt

Examples:
  aov receipt verify --card https://verifier.example/.well-known/agent-card.json receipt.json
  aov receipt verify --card agent-card.json --request request.json receipt.json
  aov receipt verify --public-key "$(cat keys/k1.pub)" - < receipt.json

--public-key takes the raw key, base64 of its 32 bytes (what "aov keygen"
writes to LABEL.pub and agent cards publish in publicKey), not a PEM or DER
(MCowBQ…) encoding.
`

// Size limits on what the command reads: receipts and cards are small;
// anything larger is a mistake or hostile.
const (
	maxReceiptBytes = 8 << 20
	maxCardBytes    = receipt.MaxCardBytes
	maxRequestBytes = 64 << 20
	cardTimeout     = 10 * time.Second
)

// httpClient fetches cards; tests may replace it.
var httpClient = &http.Client{Timeout: cardTimeout}

func receiptVerify(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("aov receipt verify", stderr)
	cardArg := fs.String("card", "", "agent card file or http(s) URL")
	keyArg := fs.String("public-key", "", "bare Ed25519 public key, base64")
	requestArg := fs.String("request", "", "request body file to recompute the hashes from")
	contextArg := fs.String("context", "", "verify or score (default: inferred)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return flagError(err, receiptVerifyHelp, stdout, stderr)
	}
	if len(pos) != 1 {
		return usageError(stderr, receiptVerifyHelp, "aov receipt verify: want exactly one RECEIPT_FILE (or - for standard input), got %d", len(pos))
	}
	// Standard input is read once, so at most one input can be "-".
	var fromStdin []string
	for _, in := range []struct{ name, arg string }{{"the receipt", pos[0]}, {"--card", *cardArg}, {"--request", *requestArg}} {
		if in.arg == "-" {
			fromStdin = append(fromStdin, in.name)
		}
	}
	if len(fromStdin) > 1 {
		return usageError(stderr, receiptVerifyHelp, "aov receipt verify: %s cannot both come from standard input", strings.Join(fromStdin, " and "))
	}
	signCtx, ok := contextFlag(*contextArg)
	if !ok {
		return usageError(stderr, receiptVerifyHelp, "aov receipt verify: --context must be verify or score")
	}

	resp, err := readInput(pos[0], stdin, maxReceiptBytes)
	if err != nil {
		return trouble(stderr, "reading the receipt: %v", err)
	}
	if what := notAReceipt(resp); what != "" {
		return trouble(stderr, "the input is %s", what)
	}

	var keys receipt.KeySet
	switch {
	case *cardArg != "" && *keyArg != "":
		return usageError(stderr, receiptVerifyHelp, "aov receipt verify: give --card or --public-key, not both")
	case *keyArg != "":
		pub, err := receipt.ParsePublicKey(*keyArg)
		if err != nil {
			hint := ""
			if strings.HasPrefix(strings.TrimSpace(*keyArg), "MCowBQYDK2Vw") || strings.Contains(*keyArg, "BEGIN PUBLIC KEY") {
				hint = " (this is a PEM or DER SubjectPublicKeyInfo; give base64 of the raw 32-byte key, the publicKey of the agent card)"
			}
			return usageError(stderr, receiptVerifyHelp, "aov receipt verify: --public-key: %v%s", err, hint)
		}
		keys = receipt.SingleKey("", pub)
	case *cardArg != "":
		card, err := loadCard(*cardArg, stdin)
		if err != nil {
			return trouble(stderr, "loading the agent card: %v", err)
		}
		if keys, err = receipt.KeysFromCard(card); err != nil {
			return trouble(stderr, "%v", err)
		}
	default:
		hint := ""
		if u := cardURLOf(resp); u != "" {
			hint = fmt.Sprintf(" (this receipt says its card is at %q)", u)
		}
		return usageError(stderr, receiptVerifyHelp, "aov receipt verify: need a public key: --card FILE_OR_URL%s or --public-key BASE64", hint)
	}

	var want receipt.Expected
	if *requestArg != "" {
		body, err := readInput(*requestArg, stdin, maxRequestBytes)
		if err != nil {
			return trouble(stderr, "reading the request: %v", err)
		}
		if want, err = verify.ComputeExpected(body); err != nil {
			return trouble(stderr, "recomputing hashes from the request: %v", err)
		}
	}

	if err := receipt.VerifyReceipt(resp, keys, signCtx); err != nil {
		fmt.Fprintf(stdout, "invalid: %s\n", oneLine(err.Error()))
		return exitInvalid
	}
	if *requestArg != "" {
		if err := receipt.CheckRequest(resp, want); err != nil {
			fmt.Fprintf(stdout, "invalid: %s\n", oneLine(err.Error()))
			return exitInvalid
		}
	}
	fmt.Fprintln(stdout, "valid")
	return exitValid
}

// contextFlag maps --context to a signing context; the full context strings
// are accepted too.
func contextFlag(v string) (string, bool) {
	switch v {
	case "":
		return "", true
	case "verify", receipt.ContextVerify:
		return receipt.ContextVerify, true
	case "score", receipt.ContextScore:
		return receipt.ContextScore, true
	}
	return "", false
}

// trouble prints an error line and returns the exit status for it. Errors
// may carry text of a card, a receipt or a server, so they pass printable
// first.
func trouble(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "error: %s\n", printable(fmt.Sprintf(format, args...)))
	return exitTrouble
}

// oneLine keeps a reason on the single line scripts read, printable.
func oneLine(s string) string { return printable(strings.ReplaceAll(s, "\n", "; ")) }

// printable replaces every character that is not printable (control
// characters, invalid UTF-8) with '?', so text from a card, a receipt or a
// server cannot steer the terminal it is printed on. The packages quote
// what they echo; this is the last line, where everything is printed.
func printable(s string) string {
	if !strings.ContainsFunc(s, notPrintable) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if notPrintable(r) {
			r = '?'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func notPrintable(r rune) bool { return r != '\n' && !unicode.IsPrint(r) }

// readInput reads a file, or standard input for "-", refusing more than
// limit bytes.
func readInput(name string, stdin io.Reader, limit int64) ([]byte, error) {
	var r io.Reader
	if name == "-" {
		r = stdin
	} else {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

// loadCard reads an agent card from a file or an http(s) URL. src is
// parsed as a URL once: its scheme is case-insensitive (RFC 3986 §3.1,
// as net/http takes it), so HTTPS://… is fetched, never opened as a file.
// A file's error names src without the user information it may carry
// (a token given as TOKEN@ in what only looks like a URL). "-" reads the
// card from stdin, as it reads the receipt and the request.
func loadCard(src string, stdin io.Reader) ([]byte, error) {
	u, perr := url.Parse(src) // url.Parse lowers the scheme
	if perr == nil && (u.Scheme == "http" || u.Scheme == "https") {
		ctx, cancel := context.WithTimeout(context.Background(), cardTimeout)
		defer cancel()
		return receipt.FetchCard(ctx, httpClient, src)
	}
	b, err := readInput(src, stdin, maxCardBytes)
	if pe, ok := errors.AsType[*fs.PathError](err); ok && perr == nil && u.User != nil {
		c := *u
		c.User = nil
		pe.Path = c.String()
	}
	return b, err
}

// runeOffset is the byte offset of the n-th rune of s, len(s) if s has
// fewer.
func runeOffset(s string, n int) int {
	for i := range s {
		if n == 0 {
			return i
		}
		n--
	}
	return len(s)
}

// cardURLOf reports the receipt's verify.public_key_url, for the hint when
// no key was given; "" when the receipt does not say.
func cardURLOf(resp []byte) string {
	var r struct {
		Verify struct {
			PublicKeyURL string `json:"public_key_url"`
		} `json:"verify"`
	}
	if err := json.Unmarshal(resp, &r); err != nil {
		return ""
	}
	u := r.Verify.PublicKeyURL
	if len(u) > 200 || !(strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://")) {
		return ""
	}
	return u
}

// notAReceipt recognises the answers a pipeline hands over when the call
// did not produce a receipt (the error shape of SPEC §6, or a 402's demand
// for payment) and describes them; "" for anything else, which is then
// checked as a receipt. Without it, `curl … | aov receipt verify -` on a
// refused call reports a missing attestation instead of the refusal. The
// service's messages never echo input, so the message is safe to print.
func notAReceipt(resp []byte) string {
	var r struct {
		Attestation json.RawMessage `json:"attestation"`
		Code        string          `json:"code"`
		Status      int             `json:"status"`
		Message     string          `json:"message"`
		X402Version int             `json:"x402Version"`
		Accepts     json.RawMessage `json:"accepts"`
		Reason      string          `json:"reason"`
	}
	if json.Unmarshal(resp, &r) != nil || r.Attestation != nil {
		return ""
	}
	// The input may be anything: print at most 300 runes of it, control
	// characters and invalid UTF-8 replaced, so it cannot steer a terminal.
	clip := func(s string) string {
		if i := runeOffset(s, 300); i < len(s) {
			s = s[:i] + "…"
		}
		return printable(strings.ReplaceAll(s, "\n", "?"))
	}
	switch {
	case r.Code != "" && r.Status >= 400:
		return fmt.Sprintf("an error response (HTTP %d %s: %s), not a receipt: nothing was verified or signed", r.Status, clip(r.Code), clip(r.Message))
	case r.X402Version != 0 && r.Accepts != nil:
		what := "a demand for payment (HTTP 402"
		if r.Reason != "" {
			what += ", reason " + clip(r.Reason)
		}
		return what + "), not a receipt: pay for the call, then check its answer"
	}
	return ""
}
