package receipt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// MaxCardBytes caps an agent card read by FetchCard: a card is small, and
// anything larger is a mistake or hostile.
const MaxCardBytes = 1 << 20

// FetchCard fetches the agent card at an http(s) URL, for KeysFromCard: the
// one way a card is fetched, by `aov receipt verify --card URL` and by the
// gateway checking the receipts it attaches. The deadline is ctx's (and
// client's Timeout). At most MaxCardBytes are read, and only a 200 is a
// card. Redirects are followed as client would (net/http: at most 10), but
// never from https to anything else: the keys on the card decide which
// receipts verify, and a plain-http leg lets whoever is on the network path
// supply them. Errors name the URL without its user information (which may
// be a password, or a token given as the user name) and never carry the
// server's text.
func FetchCard(ctx context.Context, client *http.Client, cardURL string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cardURL, nil)
	if err != nil {
		return nil, errors.New("the card URL does not parse")
	}
	named := withoutUserInfo(req.URL)
	req.Header.Set("Accept", "application/json")
	c := *client
	c.CheckRedirect = checkCardRedirect
	res, err := c.Do(req)
	if err != nil {
		// net/http's *url.Error names the URL it was at (the card's, or a
		// redirect's target) with a password masked but a user name as
		// given, and a token is often given as one: https://TOKEN@host/.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			if u, perr := url.Parse(ue.URL); perr == nil {
				ue.URL = withoutUserInfo(u)
			} else {
				ue.URL = named
			}
		}
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, &CardStatusError{URL: named, Status: res.StatusCode}
	}
	b, err := io.ReadAll(io.LimitReader(res.Body, MaxCardBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", named, err)
	}
	if len(b) > MaxCardBytes {
		return nil, fmt.Errorf("%s sent more than %d bytes", named, MaxCardBytes)
	}
	return b, nil
}

// withoutUserInfo is u as FetchCard's errors name it: with no user
// information.
func withoutUserInfo(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}

// CardStatusError is FetchCard's error for a server that answered with a
// status other than 200: the URL names no card (a 404: the address of
// something else, such as verifierd, which does not serve one), or the
// server is failing for now (a 5xx).
type CardStatusError struct {
	URL    string // without its user information
	Status int
}

// Error names the URL and the code alone: the reason phrase is the
// server's text.
func (e *CardStatusError) Error() string {
	return fmt.Sprintf("%s answered HTTP %d", e.URL, e.Status)
}

// checkCardRedirect follows a card URL's redirects (at most 10, as
// net/http does) but never from https to anything else (FetchCard).
func checkCardRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	for _, prev := range via {
		if prev.URL.Scheme == "https" && req.URL.Scheme != "https" {
			return fmt.Errorf("refusing the redirect to %s: a card requested over https is never fetched over %s; give the card's https address", req.URL.Scheme+"://"+req.URL.Host, req.URL.Scheme)
		}
	}
	return nil
}
