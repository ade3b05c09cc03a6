package apierr

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestWriteShape(t *testing.T) {
	cases := []struct {
		desc       string
		err        error
		status     int
		code       string
		retryable  bool
		retryAfter string
		allow      string
	}{
		{"invalid request names its fields", Invalid(Field{"rules[0].type", "is not one of the allowed values", "Use one of: 'sum_equals'."}), 422, CodeInvalidRequest, false, "", ""},
		{"too large names the limit", TooLarge(1 << 20), 413, CodePayloadTooLarge, false, "", ""},
		{"a URL too long names the limit", URITooLong(2048), 414, CodeURITooLong, false, "", ""},
		{"not found", NotFound("route"), 404, CodeNotFound, false, "", ""},
		{"method not allowed sets Allow", MethodNotAllowed("POST"), 405, CodeMethodNotAllowed, false, "", "POST"},
		{"unsupported media type", UnsupportedMediaType(), 415, CodeUnsupportedMediaType, false, "", ""},
		{"unauthorized", Unauthorized("expired"), 401, CodeUnauthorized, false, "", ""},
		{"rate limited is retryable", RateLimited(7), 429, CodeRateLimited, true, "7", ""},
		{"upstream unavailable is retryable", Unavailable("signing service", 2, errors.New("dial unix: refused")), 503, CodeUpstreamUnavailable, true, "2", ""},
		{"a plain error becomes internal", errors.New("secret detail"), 500, CodeInternal, true, "1", ""},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			rec := httptest.NewRecorder()
			Write(rec, tc.err)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d", rec.Code, tc.status)
			}
			if got := rec.Header().Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
			}
			if got := rec.Header().Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if body["code"] != tc.code || body["status"] != float64(tc.status) || body["retryable"] != tc.retryable || body["charged"] != false {
				t.Errorf("body %s", rec.Body)
			}
			if _, ok := body["next_actions"].([]any); !ok {
				t.Errorf("next_actions missing: %s", rec.Body)
			}
			msg, _ := body["message"].(string)
			if !strings.Contains(strings.ToLower(msg), "nothing was charged") {
				t.Errorf("message does not say nothing was charged: %q", msg)
			}
			if strings.Contains(rec.Body.String(), "secret detail") || strings.Contains(rec.Body.String(), "refused") {
				t.Errorf("internal cause leaked: %s", rec.Body)
			}
		})
	}
}

func TestInvalidMessageNamesTheFirstProblem(t *testing.T) {
	e := Invalid(Field{Field: "rules[0].type", Problem: "is not one of the allowed values"}, Field{Field: "task_id", Problem: "is required"})
	const want = "The request is invalid: rules[0].type is not one of the allowed values. Nothing was charged; fix the field(s) and send it again."
	if e.Message != want {
		t.Errorf("message %q\nwant    %q", e.Message, want)
	}
	if e := Invalid(); !strings.HasPrefix(e.Message, "The request is invalid. Nothing was charged") {
		t.Errorf("message without fields %q", e.Message)
	}
}

func TestDurationsAreWorded(t *testing.T) {
	for n, want := range map[int]string{1: "1 second", 2: "2 seconds", 0: "0 seconds", 30: "30 seconds"} {
		if got := Seconds(n); got != want {
			t.Errorf("Seconds(%d) = %q, want %q", n, got, want)
		}
	}
	if m := RateLimited(1).Message; !strings.Contains(m, "retry after 1 second.") {
		t.Errorf("RateLimited(1): %q", m)
	}
	if m := Unavailable("signing service", 1, nil).Message; !strings.Contains(m, "retry after 1 second.") {
		t.Errorf("Unavailable(1): %q", m)
	}
	if m := Unavailable("store", 5, nil).Message; !strings.Contains(m, "retry after 5 seconds.") {
		t.Errorf("Unavailable(5): %q", m)
	}
}

func TestInvalidListsFieldsInNextActions(t *testing.T) {
	e := Invalid(Field{Field: "task_id"}, Field{Field: "rules[1].field"})
	want := []string{"task_id", "rules[1].field"}
	got := e.NextActions[0].Fields
	if e.NextActions[0].Action != "fix_request_fields" || len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("next_actions %+v", e.NextActions)
	}
}

func TestFromKeepsTypedErrorThroughWrapping(t *testing.T) {
	inner := NotFound("agent")
	wrapped := errors.Join(errors.New("context"), inner)
	if From(wrapped) != inner {
		t.Fatal("From lost the typed error")
	}
	rec := httptest.NewRecorder()
	Write(rec, wrapped)
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status %d", rec.Code)
	}
}
