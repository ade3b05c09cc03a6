package caddymodule

import (
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// `devnet { data_dir <path> }` keeps the chain in a folder; `data_dir` with
// no path (an empty environment variable in Caddyfile.example) keeps it in
// memory; two paths are refused.
func TestDevnetDataDirCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		desc, input, want string
		fails             bool
	}{
		{"a path keeps the chain there", "evm {\n devnet {\n data_dir /var/lib/devnet\n }\n}", "/var/lib/devnet", false},
		{"no path keeps it in memory", "evm {\n devnet {\n data_dir\n }\n}", "", false},
		{"two paths are refused", "evm {\n devnet {\n data_dir a b\n }\n}", "", true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			var m EVMFacilitator
			err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if tc.fails {
				if err == nil {
					t.Fatal("accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Devnet == nil || m.Devnet.DataDir != tc.want {
				t.Fatalf("devnet %+v, want data_dir %q", m.Devnet, tc.want)
			}
		})
	}
}
