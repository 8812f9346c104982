package main

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestVersionCommand: `outbox version` names the module version, the Go
// that built the binary and the schema migration it needs; --json is the
// same as one object; `outbox --version` is `outbox version`.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	all := outboxmigrate.All()
	latest := all[len(all)-1].Version

	stdout, stderr, code := runOutbox(t, nil, "version")
	if code != 0 {
		t.Fatalf("outbox version: exit %d: %s", code, stderr)
	}
	first, _, _ := strings.Cut(stdout, "\n")
	if version, ok := strings.CutPrefix(first, "outbox "); !ok || strings.TrimSpace(version) == "" {
		t.Errorf("first line %q, want outbox <version>", first)
	}
	for _, want := range []string{"module     github.com/pgoutbox/outbox\n", "go         " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		"commit     ", "migration  " + strconv.Itoa(latest) + " "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("outbox version output lacks %q:\n%s", want, stdout)
		}
	}

	flagOut, stderr, code := runOutbox(t, nil, "--version")
	if code != 0 || flagOut != stdout {
		t.Errorf("outbox --version: exit %d, %q (stderr %q); want outbox version's %q", code, flagOut, stderr, stdout)
	}

	stdout, stderr, code = runOutbox(t, nil, "version", "--json")
	if code != 0 {
		t.Fatalf("outbox version --json: exit %d: %s", code, stderr)
	}
	var v buildVersion
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("outbox version --json: %v\n%s", err, stdout)
	}
	if v.Module != "github.com/pgoutbox/outbox" || v.Version == "" || v.Go != runtime.Version() ||
		v.OS != runtime.GOOS || v.Arch != runtime.GOARCH || v.Migration != latest || (v.Commit == "") != (v.Modified == nil) {
		t.Errorf("outbox version --json: %+v", v)
	}

	help, _, code := runOutbox(t, nil, "--help")
	if code != 0 || !strings.Contains(help, "\n  version ") {
		t.Errorf("outbox --help (exit %d) does not list the version command:\n%s", code, help)
	}
}

// TestVersionOfBuildInfo: the commit, its time and whether the tree was
// modified come from the settings the go command stamps (vcs.*); without
// them the commit is unknown and modified absent.
func TestVersionOfBuildInfo(t *testing.T) {
	t.Parallel()
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/pgoutbox/outbox", Version: "v0.1.0"},
		Settings: []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-12-06T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	v := versionOf(bi)
	if v.Version != "v0.1.0" || v.Go != "go1.26.0" || v.OS != "linux" || v.Arch != "arm64" ||
		v.Commit != "0123456789abcdef0123456789abcdef01234567" || v.CommitTime != "2026-12-06T10:00:00Z" || v.Modified == nil || !*v.Modified {
		t.Errorf("versionOf: %+v", v)
	}
	var b strings.Builder
	if err := v.print(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"outbox v0.1.0\n", "commit     0123456789abcdef0123456789abcdef01234567 2026-12-06T10:00:00Z (modified)\n", "go         go1.26.0 linux/arm64\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("printed version lacks %q:\n%s", want, b.String())
		}
	}

	bi.Settings = bi.Settings[:2]
	bi.Main.Version = "(devel)"
	v = versionOf(bi)
	if v.Commit != "" || v.Modified != nil || v.Version != "(devel)" {
		t.Errorf("versionOf without vcs settings: %+v", v)
	}
	b.Reset()
	if err := v.print(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "commit     unknown (") {
		t.Errorf("printed version without a commit:\n%s", b.String())
	}
	if out, _ := json.Marshal(v); strings.Contains(string(out), "modified") || strings.Contains(string(out), "commit") {
		t.Errorf("JSON without vcs settings names a commit: %s", out)
	}
}
