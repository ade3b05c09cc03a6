package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestVersion(t *testing.T) {
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, c := range []struct {
		desc string
		info debug.BuildInfo
		want string
	}{
		{"a tagged module version", debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, "v1.4.0"},
		{"a VCS pseudo-version", debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201221145-fe2b4091637c+dirty"}},
			"v0.0.0-20261201221145-fe2b4091637c+dirty"},
		{"a devel build with a commit", debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: settings("vcs", "git", "vcs.revision", "fe2b4091637ca1b3ebb54bcda67c28ada6d214da", "vcs.modified", "false")}, "fe2b4091637c"},
		{"a devel build with changes", debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: settings("vcs.revision", "fe2b4091637ca1b3", "vcs.modified", "true")}, "fe2b4091637c+dirty"},
		{"nothing stamped", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Unknown},
	} {
		if got := fromBuildInfo(&c.info); got != c.want {
			t.Errorf("%s: %q, want %q", c.desc, got, c.want)
		}
	}
	if got := Version("1.2.3"); got != "1.2.3" {
		t.Errorf("Version with an -ldflags override = %q", got)
	}
	if got := Version(""); got == "" || got == "dev" {
		t.Errorf("Version of this test binary = %q", got)
	}
}
