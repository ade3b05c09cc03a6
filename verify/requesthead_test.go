package verify

import (
	"errors"
	"testing"

	"github.com/aovhq/aov/apierr"
)

// CheckMediaType takes the plain "application/json" on its fast path and
// decides everything else as mime.ParseMediaType reads it; an empty body is
// not checked, and a body of unknown length (-1) is.
func TestCheckMediaType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                true,
		"Application/JSON":                true,
		"application/json; charset=utf-8": true,
		"application/problem+json":        true,
		"application/json ":               true,
		"application/jsonx":               false,
		"application/json;":               true,
		"text/json":                       false,
		"text/plain":                      false,
		"application/+json; x":            false,
		"application/json; charset":       false,
		"":                                false,
	} {
		for _, n := range []int64{1, -1} {
			err := CheckMediaType(ct, n)
			var ae *apierr.Error
			if want && err != nil {
				t.Errorf("CheckMediaType(%q, %d) = %v, want nil", ct, n, err)
			}
			if !want && (!errors.As(err, &ae) || ae.Code != apierr.CodeUnsupportedMediaType || ae.Status != 415) {
				t.Errorf("CheckMediaType(%q, %d) = %v, want 415 unsupported_media_type", ct, n, err)
			}
		}
		if err := CheckMediaType(ct, 0); err != nil {
			t.Errorf("CheckMediaType(%q, 0) = %v: an empty body has no media type to check", ct, err)
		}
	}
}
