// Package signflip builds JSON arrays whose members differ only in the
// signs of their numbers, for the tests of what verification costs: the
// schema compiler's duplicate check (santhosh-tekuri/jsonschema/v6) hashes
// a number without its sign, so such members all fall in one bucket and
// are compared pairwise, deeply, and each comparison of two numbers parses
// both into big.Rat. One generator, so the tests of the gate, the verifier
// and the schema package measure the same inputs.
package signflip

import "strings"

// Square is n arrays of n ones, the i-th with a -1 at position n-1-i: n
// members that are all distinct, the comparison of two of them running
// as deep as the later -1.
func Square(n int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('[')
		for j := range n {
			if j > 0 {
				b.WriteByte(',')
			}
			if j == n-1-i {
				b.WriteString("-1")
			} else {
				b.WriteByte('1')
			}
		}
		b.WriteByte(']')
	}
	b.WriteByte(']')
	return b.String()
}

// Rows is rows arrays of cols copies of the number num, the i-th with the
// signs of its last eight numbers flipped where the bits of i are set:
// distinct members (up to 256 of them) whose comparisons run to their
// ends, each step parsing two copies of num.
func Rows(num string, rows, cols int) string {
	out := make([]string, rows)
	row := make([]string, cols)
	for i := range out {
		for j := range row {
			row[j] = num
		}
		for b := range 8 {
			if i>>b&1 == 1 {
				row[cols-1-b] = "-" + num
			}
		}
		out[i] = "[" + strings.Join(row, ",") + "]"
	}
	return "[" + strings.Join(out, ",") + "]"
}
