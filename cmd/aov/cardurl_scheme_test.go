package main

import (
	"bytes"
	"strings"
	"testing"
)

// A URL's scheme is case-insensitive (RFC 3986 §3.1; net/http and
// FetchCard take HTTPS://): --card HTTPS://TOKEN@host/card is fetched as
// the URL it is, and nothing printed carries its user information, as for
// https://TOKEN@host/card; a file argument that merely looks like such a
// URL is named without it too. (Before: loadCard told a URL from a file by
// the lowercase prefixes alone, opened it as a file, and os.Open's error
// printed the whole argument, token included.)
func TestReceiptVerifyCardURLOfAnyCaseHidesItsUserInfo(t *testing.T) {
	_, priv := key(1)
	rf := writeFile(t, t.TempDir(), "r.json", signedReceipt(t, invoiceRequest, priv, "k1"))
	for _, u := range []string{"HTTPS://ghp_SECRETTOKEN@127.0.0.1:1/card", "Http://reader:ghp_SECRETTOKEN@127.0.0.1:1/card", "htps://ghp_SECRETTOKEN@127.0.0.1:1/card"} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"receipt", "verify", "--card", u, rf}, nil, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		if strings.Contains(out, "ghp_") {
			t.Errorf("%s: exit %d, output carries the URL's user information: %q", u, code, out)
		}
		// Fetched (the port refuses), not opened as a file, unless the
		// scheme is not http(s).
		if fetched := !strings.Contains(out, "no such file"); fetched != !strings.HasPrefix(u, "htps") || code == 0 {
			t.Errorf("%s: exit %d, %q; want it fetched only when the scheme is http(s), and a failure", u, code, out)
		}
	}
}
