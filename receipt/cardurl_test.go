package receipt

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// Every error of FetchCard names the URL without its user information: a
// token given as https://TOKEN@host/ is a user name, and net/http's own
// errors (nothing listening, a deadline, a refused redirect) mask only a
// password. (Before: those were returned as net/http made them, and printed
// the token.)
func TestFetchCardErrorsNameTheURLWithoutUserInfo(t *testing.T) {
	closed := closedAddr(t)
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hang.Close()
	missing := httptest.NewServer(http.NotFoundHandler())
	defer missing.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://ghp_REDIRECTTOKEN:hunter2@"+closed+"/moved", http.StatusFound)
	}))
	defer redirect.Close()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

	for _, tc := range []struct {
		desc, cardURL, named string
		urlError             bool // the error is net/http's *url.Error
	}{
		{"nothing listening, a token as the user name", "http://ghp_SECRETTOKEN@" + closed + "/card", "http://" + closed + "/card", true},
		{"nothing listening, a user and a password", "http://ghp_SECRETTOKEN:hunter2@" + closed + "/card", "http://" + closed + "/card", true},
		{"the deadline passes", "http://ghp_SECRETTOKEN@" + host(hang) + "/card", "http://" + host(hang) + "/card", true},
		{"a redirect to a URL with user information that fails", "http://ghp_SECRETTOKEN@" + host(redirect) + "/card", "http://" + closed + "/moved", true},
		{"a 404", "http://ghp_SECRETTOKEN@" + host(missing) + "/card", "http://" + host(missing) + "/card answered HTTP 404", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := FetchCard(ctx, &http.Client{Timeout: 5 * time.Second}, tc.cardURL)
			if err == nil {
				t.Fatal("fetch succeeded")
			}
			for _, secret := range []string{"ghp_", "hunter2", "***"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("the error carries user information (%s): %v", secret, err)
				}
			}
			if !strings.Contains(err.Error(), tc.named) {
				t.Errorf("the error %q does not name %s", err, tc.named)
			}
			if _, ok := errors.AsType[*url.Error](err); ok != tc.urlError {
				t.Errorf("*url.Error: %v, want %v (%v)", ok, tc.urlError, err)
			}
		})
	}
}
