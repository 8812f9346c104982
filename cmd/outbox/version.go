package main

// outbox version: what this binary is, from what the Go toolchain recorded
// in it (runtime/debug.ReadBuildInfo): the module's version, the commit it
// was built from, the Go that built it, and the schema migration it needs.

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

const versionUsage = `version [--json]

Prints what this binary is: the module version ("v0.1.0" when installed with
'go install github.com/pgoutbox/outbox/cmd/outbox@v0.1.0'; a pseudo-version
or "(devel)" when built from a checkout), the VCS commit it was built from and
whether the work tree had changes (when the go command stamped it: builds in
a git checkout, unless -buildvcs=false), the Go version and platform that
built it, and the schema migration it needs ('outbox migrate' brings a
schema there). 'outbox --version' prints the same.`

// buildVersion is what outbox version prints; its JSON form is --json's.
type buildVersion struct {
	Module     string `json:"module"`
	Version    string `json:"version"`
	Commit     string `json:"commit,omitempty"`
	CommitTime string `json:"commit_time,omitempty"`
	// Modified is true when the work tree had uncommitted changes; absent
	// without a commit.
	Modified  *bool  `json:"modified,omitempty"`
	Go        string `json:"go"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	Migration int    `json:"migration"`
}

func runVersion(_ context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "version", versionUsage)
	asJSON := fs.Bool("json", false, "print the version as JSON")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	bi, _ := debug.ReadBuildInfo() // nil without module support: fields stay unknown
	v := versionOf(bi)
	if *asJSON {
		return opJSON(os.Stdout, v)
	}
	return v.print(os.Stdout)
}

// versionOf reads bi (which may be nil).
func versionOf(bi *debug.BuildInfo) buildVersion {
	all := outboxmigrate.All()
	v := buildVersion{Module: "github.com/pgoutbox/outbox", Version: "(devel)", Go: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH, Migration: all[len(all)-1].Version}
	if bi == nil {
		return v
	}
	if bi.Main.Path != "" {
		v.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		case "GOOS":
			v.OS = s.Value
		case "GOARCH":
			v.Arch = s.Value
		}
	}
	if v.Commit != "" {
		v.Modified = &modified
	}
	return v
}

func (v buildVersion) print(w io.Writer) error {
	commit := "unknown (not stamped: installed from the module proxy, or built with -buildvcs=false)"
	if v.Commit != "" {
		commit = v.Commit
		if v.CommitTime != "" {
			commit += " " + v.CommitTime
		}
		if *v.Modified {
			commit += " (modified)"
		}
	}
	_, err := fmt.Fprintf(w, "outbox %s\nmodule     %s\ncommit     %s\ngo         %s %s/%s\nmigration  %d (the schema version this binary needs: outbox migrate)\n",
		v.Version, v.Module, commit, v.Go, v.OS, v.Arch, v.Migration)
	return err
}
