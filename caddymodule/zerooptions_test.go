package caddymodule

import "testing"

// An option written as 0 is a config error at its line, naming it; left
// out, it takes its default. (Before: max_timeout 0s, which README calls a
// config error as shorter than 7s, was 60s; max_body 0 was 1MiB;
// max_buffer 0 was 10MiB; free_allowance's max_body 0 was 64KiB: an
// operator who wrote 0 to mean "none" got the default without a word.)
func TestZeroOptionIsAConfigError(t *testing.T) {
	gate := func(lines string) string {
		return "x402 {\n\taccept base $0.01 " + cfgPayTo + "\n\tfacilitator http http://127.0.0.1:1\n" + lines + "\n}"
	}
	for _, tc := range []struct{ desc, directives, want string }{
		{"max_timeout 0s", "x402 {\n\taccept {\n\t\tnetwork base\n\t\tprice $0.01\n\t\tpay_to " + cfgPayTo + "\n\t\tmax_timeout 0s\n\t}\n}",
			"max_timeout: 0s is shorter than 7s (leave max_timeout out for its default, 60s), at Caddyfile:7"},
		{"max_timeout 0", "x402 {\n\taccept {\n\t\tnetwork base\n\t\tprice $0.01\n\t\tpay_to " + cfgPayTo + "\n\t\tmax_timeout 0\n\t}\n}",
			"max_timeout: 0 is shorter than 7s"},
		{"max_body 0", gate("\tmax_body 0"), "max_body: 0 is not a size: write a positive one, or leave max_body out for its default, at Caddyfile:5"},
		{"max_body 0B", gate("\tmax_body 0B"), "max_body: 0B is not a size"},
		{"max_buffer 0", gate("\tmax_buffer 0"), "max_buffer: 0 is not a size"},
		{"free_allowance max_body 0", gate("\tfree_allowance {\n\t\tper_day 3\n\t\tmax_body 0\n\t}"), "max_body: 0 is not a size"},
		{"max_answer 0", gate("\tpayment_identifier {\n\t\tmax_answer 0\n\t}"), "max_answer: 0 is not a size"},
		{"verify_response max_response 0", "verify_response {\n\tmax_response 0\n}", "max_response: 0 is not a size"},
		{"max_timeout 7s", "x402 {\n\taccept {\n\t\tnetwork base\n\t\tprice $0.01\n\t\tpay_to " + cfgPayTo + "\n\t\tmax_timeout 7s\n\t}\n}", ""},
		{"max_body 1", gate("\tmax_body 1"), ""},
		{"max_buffer 1KiB", gate("\tmax_buffer 1KiB"), ""},
		{"free_allowance max_body 1", gate("\tfree_allowance {\n\t\tper_day 3\n\t\tmax_body 1\n\t}"), ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptFile(tc.directives), tc.want)
		})
	}
}
