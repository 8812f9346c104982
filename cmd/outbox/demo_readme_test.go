package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// quickStart returns the README's "Quick start" section.
func quickStart(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "\n## Quick start\n")
	if start < 0 {
		t.Fatal("README.md has no Quick start section")
	}
	s = s[start+1:]
	if end := strings.Index(s[3:], "\n## "); end >= 0 {
		s = s[:end+3]
	}
	return s
}

// makeTargets parses the Makefile: each documented target's recipe lines.
func makeTargets(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string][]string{}
	target := ""
	for _, line := range strings.Split(string(b), "\n") {
		if m := regexp.MustCompile(`^([a-z-]+):.*## `).FindStringSubmatch(line); m != nil {
			target = m[1]
			targets[target] = nil
			continue
		}
		if strings.HasPrefix(line, "\t") && target != "" {
			targets[target] = append(targets[target], strings.TrimSpace(line))
			continue
		}
		target = ""
	}
	return targets
}

// TestQuickStartAgrees checks that the README's quick start, `make help`
// and `outbox demo --help` agree: every command of the quick start is the
// recipe of a target `make help` lists; every demo flag (and value) the
// quick start or the Makefile uses is in `demo --help`; the other flags
// belong to .ci/setup or docker compose.
func TestQuickStartAgrees(t *testing.T) {
	t.Parallel()
	qs := quickStart(t)
	targets := makeTargets(t)
	help, err := exec.Command("make", "-C", filepath.Join("..", ".."), "--no-print-directory", "help").CombinedOutput()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, help)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(help), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			listed[f[0]] = true
		}
	}
	for target := range targets {
		if !listed[target] {
			t.Errorf("make help does not list target %s", target)
		}
	}
	demoHelp, _ := exec.Command(outboxBinary(t), "demo", "--help").CombinedOutput()
	flagsInHelp := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(string(demoHelp), -1) {
		flagsInHelp[m[1]] = true
	}
	if len(flagsInHelp) < 10 {
		t.Fatalf("demo --help lists %d flags:\n%s", len(flagsInHelp), demoHelp)
	}
	// A default is shown as it is, not as a URL that failed to parse
	// (--destination's "nats" once was).
	if !strings.Contains(string(demoHelp), `(default "nats")`) || strings.Contains(string(demoHelp), "unparsable") {
		t.Errorf("demo --help does not show --destination's default \"nats\" as it is:\n%s", demoHelp)
	}
	setupHelp, err := exec.Command("bash", filepath.Join("..", "..", ".ci", "setup"), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf(".ci/setup --help: %v", err)
	}

	// The commands of the quick start's code block, each a make target's.
	block := qs[strings.Index(qs, "```sh\n")+len("```sh\n"):]
	block = block[:strings.Index(block, "```")]
	var commands []string
	for _, line := range strings.Split(block, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cmd, _, _ := strings.Cut(line, " #")
		commands = append(commands, strings.TrimSpace(cmd))
	}
	if m := regexp.MustCompile("`(docker compose [^`]*)`").FindStringSubmatch(qs); m != nil {
		commands = append(commands, m[1])
	}
	for _, want := range []string{"go run ./cmd/outbox demo", "bash .ci/run", "bash .ci/setup --dry-run", "docker compose up -d --wait"} {
		found := false
		for _, c := range commands {
			found = found || c == want
		}
		if !found {
			t.Errorf("the quick start does not give %q", want)
		}
	}
	for _, c := range commands {
		found := ""
		for target, recipe := range targets {
			if len(recipe) == 1 && recipe[0] == c {
				found = target
			}
		}
		if found == "" {
			t.Errorf("the quick start's %q is no make target's recipe", c)
		}
	}

	// Every demo flag used, with its values, is in demo --help.
	check := func(where, line string) {
		for _, m := range regexp.MustCompile(`--([a-z][a-z-]*)((?: [a-z]+|\|[a-z]+)*)`).FindAllStringSubmatch(line, -1) {
			name, values := m[1], m[2]
			switch name {
			case "dry-run":
				if !strings.Contains(string(setupHelp), "--dry-run") {
					t.Errorf("%s: .ci/setup --help has no --dry-run", where)
				}
				continue
			case "wait":
				continue // docker compose up's
			case "help":
				continue // every command's
			}
			if !flagsInHelp[name] {
				t.Errorf("%s: --%s is not a flag of outbox demo (--help)", where, name)
				continue
			}
			flagHelp := regexp.MustCompile(`(?m)^  -` + name + `( \w+)?\n(?:    .*\n)*`).FindStringSubmatch(string(demoHelp))
			if flagHelp == nil || flagHelp[1] == "" || len(strings.Fields(values)) == 0 {
				continue // a boolean flag (no value in its help line), or none given
			}
			// The first word after the flag is its value, or values
			// separated by "|".
			for _, v := range strings.Split(strings.Fields(values)[0], "|") {
				if !strings.Contains(flagHelp[0], v) {
					t.Errorf("%s: --%s %s: demo --help does not mention %q for --%s", where, name, v, v, name)
				}
			}
		}
	}
	for _, line := range strings.Split(qs, "\n") {
		if strings.Contains(line, "--") {
			check("README", line)
		}
	}
	for target, recipe := range targets {
		for _, line := range recipe {
			if strings.Contains(line, "cmd/outbox demo") {
				check("make "+target, line)
			}
		}
	}
}
