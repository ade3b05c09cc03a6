package strictjson

import "slices"

// FoldedTwin reports a member name of m that equals another of its names
// under Unicode simple case folding (the relation of Limits.FoldedNames),
// and false when there is none. Of several twins it names the first in
// byte order that has an earlier twin, so the same object always names the
// same member.
//
// It is for documents whose levels differ: a reader that decodes some
// levels into named fields (where a case-insensitive reader could take
// either twin) and keeps others as free-form data (where twins are
// distinct keys to every reader) decodes without FoldedNames and checks
// the named levels with FoldedTwin.
func FoldedTwin(m map[string]any) (string, bool) {
	if len(m) < 2 {
		return "", false
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	folds := foldSet{stack: new([]string)}
	for _, k := range names {
		if !folds.add(k) {
			return k, true
		}
	}
	return "", false
}
