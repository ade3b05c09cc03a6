package walletauth

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCanonicalPath: one form per RFC 3986 path, valid as a URI path, and
// never an encoded slash decoded.
func TestCanonicalPath(t *testing.T) {
	for in, want := range map[string]string{
		"/report/q1":            "/report/q1",
		"/report/a[1]":          "/report/a%5B1%5D",
		"/report/a%5b1%5D":      "/report/a%5B1%5D",
		"/report/a%2Fb":         "/report/a%2Fb",
		"/report/a%2fb":         "/report/a%2Fb",
		"/report/a%7eb":         "/report/a~b",
		"/report/a%7Eb":         "/report/a~b",
		"/report/%41%2d%5F":     "/report/A-_",
		"/report/%e2%82%ac%20x": "/report/%E2%82%AC%20x",
		"/report/q'(1);b=c:@!":  "/report/q'(1);b=c:@!",
		"/report/a|b^c\"d`{}\\": "/report/a%7Cb%5Ec%22d%60%7B%7D%5C",
		"/report/50%":           "/report/50%25",
		"/report/%zz":           "/report/%25zz",
		"/report/%":             "/report/%25",
	} {
		if got := CanonicalPath(in); got != want {
			t.Errorf("CanonicalPath(%q) = %q, want %q", in, got, want)
		}
		if got := CanonicalPath(want); got != want {
			t.Errorf("CanonicalPath(%q) = %q: not stable", want, got)
		}
	}
}

// TestSIWXURIIsTheEscapedPath: a sign-in-with-x proof names its resource
// by the escaped path: its uri and the request's path match when RFC 3986
// says they are the same (an encoded bracket or tilde, hex case), and an
// encoded slash is never the same as a slash.
func TestSIWXURIIsTheEscapedPath(t *testing.T) {
	for _, c := range []struct {
		uriPath, requestPath string
		ok                   bool
	}{
		{"/report/a%5B1%5D", "/report/a[1]", true},
		{"/report/a~b", "/report/a%7eb", true},
		{"/report/a%2fb", "/report/a%2Fb", true},
		{"/report/a/b", "/report/a%2Fb", false},
		{"/report/a%2Fb", "/report/a/b", false},
	} {
		v := &Verifier{Nonces: newDB(t).Claims(), Now: clock(t0.Add(time.Minute))}
		h := siwxHeader(t, siwxProof(t, t0, func(s *SIWX) { s.URI = "https://api.example.com" + c.uriPath }))
		_, err := v.VerifySIWX(context.Background(), h, SIWXExpect{Domain: "api.example.com", Scheme: "https", Path: c.requestPath})
		if c.ok && err != nil || !c.ok && !errors.Is(err, ErrWrongRequest) {
			t.Errorf("uri path %s on the request path %s: %v, want accepted %v", c.uriPath, c.requestPath, err, c.ok)
		}
	}
}
