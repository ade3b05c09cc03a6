package x402

import (
	"strings"
	"testing"
)

func TestParsePrice(t *testing.T) {
	for _, tc := range []struct {
		desc     string
		price    string
		decimals int
		want     string // "" when refused
	}{
		{"$0.02 is 20000 units of a 6-decimal asset", "$0.02", 6, "20000"},
		{"0.02 without a dollar sign is the same", "0.02", 6, "20000"},
		{"$1 is one million units", "$1", 6, "1000000"},
		{"$0.000001 is exactly one unit", "$0.000001", 6, "1"},
		{"trailing zeros within the precision are fine", "$0.020000", 6, "20000"},
		{"$1234.5 is exact", "$1234.5", 6, "1234500000"},
		{"a zero-decimal asset takes whole numbers", "7", 0, "7"},
		{"an 18-decimal asset keeps every digit", "$0.123456789012345678", 18, "123456789012345678"},
		{"float-unfriendly prices are exact", "$0.29", 6, "290000"},
		{"more decimals than the asset has are refused", "$0.0000001", 6, ""},
		{"an empty price is refused", "", 6, ""},
		{"a bare dollar sign is refused", "$", 6, ""},
		{"a negative price is refused", "-0.02", 6, ""},
		{"a negative dollar price is refused", "$-0.02", 6, ""},
		{"a plus sign is refused", "+1", 6, ""},
		{"NaN is refused", "NaN", 6, ""},
		{"Inf is refused", "Inf", 6, ""},
		{"exponent form is refused", "2e-2", 6, ""},
		{"upper-case exponent form is refused", "$1E3", 6, ""},
		{"a leading decimal point is refused", ".5", 6, ""},
		{"a trailing decimal point is refused", "5.", 6, ""},
		{"two decimal points are refused", "1.2.3", 6, ""},
		{"a thousands separator is refused", "1,000", 6, ""},
		{"spaces are refused", " 1", 6, ""},
		{"a leading zero is refused", "01", 6, ""},
		{"zero is refused", "$0", 6, ""},
		{"zero with decimals is refused", "$0.000000", 6, ""},
		{"a price beyond uint256 is refused", strings.Repeat("9", 80), 0, ""},
		{"negative decimals are refused", "1", -1, ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := ParsePrice(tc.price, tc.decimals)
			wantParsed(t, got, err, tc.want)
		})
	}
}

func TestParseAmount(t *testing.T) {
	max := "115792089237316195423570985008687907853269984665640564039457584007913129639935"
	for _, tc := range []struct {
		desc, in string
		ok       bool
	}{
		{"an integer string passes through", "20000", true},
		{"the largest uint256 passes", max, true},
		{"one more than uint256 is refused", "115792089237316195423570985008687907853269984665640564039457584007913129639936", false},
		{"a leading zero is refused", "020000", false},
		{"zero is refused", "0", false},
		{"a decimal point is refused", "20000.0", false},
		{"a dollar sign is refused", "$20000", false},
		{"a sign is refused", "+1", false},
		{"empty is refused", "", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := ParseAmount(tc.in)
			if tc.ok != (err == nil) {
				t.Fatalf("ok=%v err=%v", tc.ok, err)
			}
			if tc.ok && got != tc.in {
				t.Fatalf("changed to %q", got)
			}
		})
	}
}

func TestFormatAmount(t *testing.T) {
	for _, tc := range []struct {
		desc, in string
		decimals int
		want     string
	}{
		{"20000 units of USDC are 0.02", "20000", 6, "0.02"},
		{"one unit is 0.000001", "1", 6, "0.000001"},
		{"a million units are 1", "1000000", 6, "1"},
		{"1234500000 units are 1234.5", "1234500000", 6, "1234.5"},
		{"zero decimals leave the amount alone", "7", 0, "7"},
		{"a non-canonical amount is returned unchanged", "x", 6, "x"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if got := FormatAmount(tc.in, tc.decimals); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if p, err := ParsePrice(tc.want, tc.decimals); err == nil && p != tc.in {
				t.Fatalf("ParsePrice(FormatAmount(x)) = %q, not x", p)
			}
		})
	}
}

// wantParsed checks what a parser of operator input returned: want, or,
// with want "", a refusal.
func wantParsed(t *testing.T, got string, err error, want string) {
	t.Helper()
	if want == "" {
		if err == nil {
			t.Fatalf("accepted as %q", got)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
