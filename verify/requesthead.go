package verify

import (
	"mime"
	"net/http"
	"strings"

	"github.com/aovhq/aov/apierr"
)

// Method is the one method a verification request is sent with: verifierd
// serves its verify routes for it alone (405 otherwise), and the gateway's
// check refuses any other the same way before it settles a payment, for the
// reason CheckMediaType gives.
const Method = http.MethodPost

// CheckMediaType is the rule for the declared media type of a verification
// request's body: a body declared as anything but JSON is 415
// unsupported_media_type, before anything reads it. It is here, next to
// Precheck, because two readers must apply the same rule: verifierd, as it
// reads the body, and the gateway's check before it settles a payment (with
// settle before the buyer pays before verifierd answers, so a request
// verifierd refuses must be refused before the payment is taken, with the
// same answer). contentLength is the body's length as announced (-1:
// unknown); an empty body (0) has no media type to check and is refused, if
// at all, as a request.
func CheckMediaType(contentType string, contentLength int64) error {
	if contentLength != 0 && !isJSON(contentType) {
		return apierr.UnsupportedMediaType()
	}
	return nil
}

// isJSON accepts application/json and any +json media type (with
// parameters such as charset); an empty Content-Type is not JSON. The
// plain "application/json" most callers send is taken as it is, without
// mime.ParseMediaType's map of parameters.
func isJSON(ct string) bool {
	if ct == "application/json" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}
