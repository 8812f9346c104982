package main

import (
	"bufio"
	"bytes"
	"go/version"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// codeNeedsGo is the oldest Go outbox's own code builds with: the console's
// browser test calls testing.T.ArtifactDir (Go 1.26). `go vet`'s stdversion
// check (CI's vet phase) holds the code to the go directive; this constant
// only says how low the directive could go if the dependencies allowed it.
const codeNeedsGo = "go1.26.0"

// goDirective returns the go line of the go.mod at path, as "go1.X.Y".
func goDirective(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go "); ok {
			return "go" + strings.TrimSpace(v)
		}
	}
	t.Fatalf("%s has no go directive", path)
	return ""
}

// TestGoDirectiveIsTheDependenciesMinimum: go.mod's go directive is the
// oldest Go the module can be built with, never higher (a go directive is
// every consumer's minimum: 1.26.8 made them all upgrade): the highest go
// directive among the dependencies, or what the code itself needs if that
// is higher. The README and docs/compatibility.md say which, and bench/go.mod
// says the same.
func TestGoDirectiveIsTheDependenciesMinimum(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	directive := goDirective(t, filepath.Join(root, "go.mod"))

	cmd := exec.Command("go", "list", "-m", "-f", "{{if not .Main}}{{.Path}} {{.GoVersion}}{{end}}", "all")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, stderr.String())
	}
	want, by := codeNeedsGo, "outbox's own code"
	for line := range strings.Lines(string(out)) {
		path, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		if v != "" && version.Compare("go"+v, want) > 0 {
			want, by = "go"+v, path
		}
	}
	if directive != want {
		t.Errorf("go.mod says %s; the oldest Go the module builds with is %s (%s needs it): `go mod edit -go=%s`, then `go mod tidy`",
			directive, want, by, strings.TrimPrefix(want, "go"))
	}
	if bench := goDirective(t, filepath.Join(root, "bench", "go.mod")); bench != directive {
		t.Errorf("bench/go.mod says %s, go.mod %s", bench, directive)
	}
	line := "`go " + strings.TrimPrefix(directive, "go") + "`"
	for _, doc := range []string{"README.md", filepath.Join("docs", "compatibility.md")} {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(text), line) {
			t.Errorf("%s does not name go.mod's %s", doc, line)
		}
	}
}
