package server_test

import (
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// formatFanOutBody is a 61 KB request (within the free tier's 64 KiB)
// whose one "format":"json-pointer" schema is applied 4^7 times to a 60 KB
// string of "/".
func formatFanOutBody() []byte {
	var b strings.Builder
	b.WriteString(`{"task_id":"t","expected_schema":{"$ref":"#/$defs/a7","$defs":{"a0":{"format":"json-pointer"}`)
	for i := 1; i <= 7; i++ {
		r := `{"$ref":"#/$defs/a` + strconv.Itoa(i-1) + `"}`
		b.WriteString(`,"a` + strconv.Itoa(i) + `":{"allOf":[` + r + `,` + r + `,` + r + `,` + r + `]}`)
	}
	b.WriteString(`}},"submitted_output":"` + strings.Repeat("/", 60_000) + `"}`)
	return []byte(b.String())
}

// 2 × GOMAXPROCS such unpaid requests at once are each refused 422
// invalid_request by the step budget, nothing charged, and an honest SPEC
// §10 invoice sent while they run is verified. (Before: each passed the
// budget, held a verification slot for the whole 5 s Timeout and ended
// 503 verification_timeout, retryable, no free call spent; the honest
// invoice waited 4.7 s for a slot.)
func TestFormatFanOutIsRefusedAndLeavesSlots(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true, localSigner: true})
	attack := formatFanOutBody()
	n := 2 * runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	codes := make([]int, n)
	bodies := make([]string, n)
	for i := range n {
		wg.Go(func() {
			w := f.do(http.MethodPost, "/verify/schema", attack, nil)
			codes[i], bodies[i] = w.Code, w.Body.String()
		})
	}
	time.Sleep(300 * time.Millisecond) // let them take the slots first
	w := f.do(http.MethodPost, "/verify/schema", invoice("135.0", ""), nil)
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusUnprocessableEntity || !strings.Contains(bodies[i], `"invalid_request"`) ||
			!strings.Contains(bodies[i], "evaluation steps") || !strings.Contains(bodies[i], `"charged":false`) {
			t.Errorf("format fan-out %d: %d %.300s; want 422 invalid_request from the step budget, nothing charged", i, code, bodies[i])
		}
	}
	if w.Code != http.StatusOK {
		t.Errorf("honest invoice beside them: %d %.300s", w.Code, w.Body.String())
	}
}
