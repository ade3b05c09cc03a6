package caddymodule

import (
	"bytes"
	"fmt"
	"net/http"
	"runtime"
	"testing"

	"github.com/aovhq/aov/apidocs"
)

// Without a public_base_url the documents name each request's origin. A
// client sending a new Host on every request used to make the handler
// rebuild them each time (about 4 ms and 0.9 MB, under the cache's lock);
// they are now built once and the origin substituted, and what is served
// is what a build for that origin says.
func TestDocsBuiltOnceForEveryHost(t *testing.T) {
	d := &Docs{cache: new(docsCache)}
	get := func(host string) (openapi, llms []byte) {
		r, _ := http.NewRequest(http.MethodGet, "http://"+host+"/openapi.json", nil)
		openapi, llms, _, err := d.documents(r)
		if err != nil {
			t.Fatal(err)
		}
		return openapi, llms
	}
	openapi, llms := get("warm.example.com")
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	const hosts = 20
	for i := range hosts {
		get(fmt.Sprintf("h%d.example.com", i))
	}
	runtime.ReadMemStats(&b)
	// A substitution allocates the two documents once more; a build
	// allocates several times their size.
	if n, docs := b.TotalAlloc-a.TotalAlloc, uint64(len(openapi)+len(llms)); n > hosts*2*docs {
		t.Errorf("%d requests with new Hosts allocated %d KB; the documents are %d KB", hosts, n>>10, docs>>10)
	}
	if d.cache.builds != 1 {
		t.Errorf("the documents were built %d times for %d hosts", d.cache.builds, hosts+1)
	}
	for _, host := range []string{"a.example.com:8443", "b-c.example.com"} {
		openapi, llms := get(host)
		svc := d.service(mustRequest(host), nil)
		svc.BaseURL = "http://" + host
		want, err := apidocs.OpenAPI(svc)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(openapi, want) {
			t.Errorf("%s: the OpenAPI document differs from one built for it", host)
		}
		if wantLLMs := apidocs.LLMsTxt(svc); !bytes.Equal(llms, wantLLMs) {
			t.Errorf("%s: llms.txt differs from one built for it", host)
		}
		if bytes.Contains(openapi, []byte(docsOrigin)) || bytes.Contains(llms, []byte(docsOrigin)) {
			t.Errorf("%s: the documents still name the placeholder origin", host)
		}
	}
}

func mustRequest(host string) *http.Request {
	r, _ := http.NewRequest(http.MethodGet, "http://"+host+"/openapi.json", nil)
	return r
}
