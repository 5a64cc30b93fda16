package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

const versionUsage = `Usage: mcp-outbox version

Prints the module version, the VCS revision the binary was built from, and
the Go toolchain. 'go install …@vX.Y.Z' reports vX.Y.Z and no revision, since
the module proxy's copy carries no VCS metadata. A build from a checkout
reports the pseudo-version Go derives from its commit (with "+dirty", and the
revision with "+modified", when the work tree had uncommitted changes), or
"(devel)" when it was built with -buildvcs=false.
`

func runVersion(_ context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "version", versionUsage)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("version takes no arguments")
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		// Only a binary built without module support lacks build info.
		fmt.Fprintf(env.stdout, "mcp-outbox (unknown version) %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return nil
	}
	fmt.Fprint(env.stdout, describeBuild(bi))
	return nil
}

// describeBuild is what `mcp-outbox version` prints for a build.
func describeBuild(bi *debug.BuildInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "mcp-outbox %s\n", buildVersion(bi))
	fmt.Fprintf(&b, "module   %s\n", bi.Main.Path)
	if rev := buildSetting(bi, "vcs.revision"); rev != "" {
		if buildSetting(bi, "vcs.modified") == "true" {
			rev += "+modified"
		}
		if t := buildSetting(bi, "vcs.time"); t != "" {
			rev += " (" + t + ")"
		}
		fmt.Fprintf(&b, "revision %s\n", rev)
	}
	goos, goarch := buildSetting(bi, "GOOS"), buildSetting(bi, "GOARCH")
	if goos == "" {
		goos, goarch = runtime.GOOS, runtime.GOARCH
	}
	fmt.Fprintf(&b, "go       %s %s/%s\n", bi.GoVersion, goos, goarch)
	return b.String()
}

// buildVersion is the module version of the build: vX.Y.Z for `go install`
// of a tag; a pseudo-version for `go install` of a commit, and (since Go
// 1.24) for a build from a checkout; "(devel)" for a build without VCS
// information. serve reports it as its serverInfo version.
func buildVersion(bi *debug.BuildInfo) string {
	if bi == nil || bi.Main.Version == "" {
		return "(devel)"
	}
	return bi.Main.Version
}

func buildSetting(bi *debug.BuildInfo, key string) string {
	for _, s := range bi.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// serverVersion is the version serve and proxy announce in serverInfo: the
// module version, with the short revision for a build from a checkout.
func serverVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	v := buildVersion(bi)
	if rev := buildSetting(bi, "vcs.revision"); rev != "" && v == "(devel)" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		v = "devel+" + rev
	}
	return v
}
