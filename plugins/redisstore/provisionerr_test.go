package redisstore

import (
	"strings"
	"testing"
)

// TestProvisionErrorHidesAddressCredentials: an address given as
// {env.NAME} holding a user:password that the store cannot use is
// refused without the password, which the loaded config never held.
func TestProvisionErrorHidesAddressCredentials(t *testing.T) {
	srv, _ := standalone(t)
	t.Setenv("AOV_TEST_REDIS", "redis://default:hunter2-secret@"+srv.Addr)
	err := tryLoad(t, "http://127.0.0.1:{port} {\n\tbind 127.0.0.1\n\tx402 {\n\t\taccept base $0.01 0xa0Ee7A142d267C1f36714E4a8F75612F20a79720\n\t\tfacilitator http http://127.0.0.1:9/\n\t\tstore redis {env.AOV_TEST_REDIS}\n\t}\n\trespond ok\n}\n")
	if err == nil || !strings.Contains(err.Error(), "redis store") {
		t.Fatalf("an address that is a URL: %v, want refused by the store", err)
	}
	if strings.Contains(err.Error(), "hunter2-secret") {
		t.Errorf("the refusal repeats the password: %v", err)
	}
}
