// Package buildinfo names the version of the running binary, for the
// verifier_version of every result and the agent card's version: a receipt
// should say which build produced it, never a placeholder.
package buildinfo

import (
	"runtime/debug"
	"strings"
	"sync"
)

// Unknown is the version of a binary built without module or VCS
// information (go build -buildvcs=false outside a module version).
const Unknown = "unknown"

// Version returns override when it is set (go build -ldflags
// "-X main.version=..."); otherwise the main module's version as the Go
// toolchain stamped it (v1.2.3 for a tagged build or `go install
// module@version`, a pseudo-version v0.0.0-<time>-<commit> from the VCS
// otherwise, "+dirty" with uncommitted changes); otherwise the VCS commit;
// otherwise Unknown.
func Version(override string) string {
	if override != "" {
		return override
	}
	return stamped()
}

// stamped reads the build information once: it does not change while the
// process runs.
var stamped = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return Unknown
	}
	return fromBuildInfo(info)
})

func fromBuildInfo(info *debug.BuildInfo) string {
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	dirty := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return Unknown
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	var b strings.Builder
	b.WriteString(rev)
	if dirty {
		b.WriteString("+dirty")
	}
	return b.String()
}
