package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// The gate holds an answer and hands it on whole, so it knows its length:
// the client gets a sized answer, not a chunked one (net/http chunks a body
// over 2 KiB whose length it was not told), whether the upstream sent it
// sized or chunked (as the MCP SDK does).
func TestAHeldAnswerGoesOutSized(t *testing.T) {
	_, fac := sharedDevnet(t)
	answer := `{"result":"pass","pad":"` + strings.Repeat("x", 5000) + `"}`
	for _, tc := range []struct {
		desc  string
		sized bool
	}{
		{"an answer the upstream sized", true},
		{"an answer the upstream chunked", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				if tc.sized {
					w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
				}
				w.WriteHeader(http.StatusOK)
				io.WriteString(w, answer)
			}))
			t.Cleanup(up.Close)
			base := startCaddy(t, gateSite(up.URL, fac, 5, ""))
			resp := post(t, base+"/verify/schema", validRequest, nil)
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || string(body) != answer {
				t.Fatalf("free call: %d, %d bytes", resp.StatusCode, len(body))
			}
			if len(resp.TransferEncoding) != 0 || resp.ContentLength != int64(len(answer)) {
				t.Fatalf("held answer sent with Transfer-Encoding %v and Content-Length %d for %d bytes", resp.TransferEncoding, resp.ContentLength, len(answer))
			}
		})
	}
}
