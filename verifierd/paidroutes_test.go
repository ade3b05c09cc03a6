package main

import (
	"net/http"
	"path/filepath"
	"testing"
)

// TestDaemonRefusesPaidRoutesWithoutTheGateway: started without
// -dev-ungated-paid-routes, verifierd answers its paid score route 403 to a
// caller without the gateway token, and the free routes as usual.
func TestDaemonRefusesPaidRoutesWithoutTheGateway(t *testing.T) {
	dir := shortDir(t)
	sock := startCertd(t, dir)
	d := startDaemon(t, "-listen", "127.0.0.1:0", "-admin-listen", "", "-no-sync",
		"-data", filepath.Join(dir, "data"), "-signer-socket", sock, "-public-base-url", "https://verify.example.test")
	for path, want := range map[string]int{"/score/seller-7": http.StatusForbidden, "/reputation/seller-7": http.StatusOK} {
		resp, err := http.Get("http://" + d.api + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}
