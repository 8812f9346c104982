package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// The READMEs whose curl examples TestREADMECurlExamples runs, relative to
// this directory.
var readmes = []string{"README.md", "../../README.md"}

// readmeExample is one curl command of a README and the answer documented
// for it on the line after it: "# → 201 Created, ...".
type readmeExample struct {
	where   string // file:line
	command string // continuation lines joined
	status  int
}

// expectation is the line after a curl example: "# → <code> <reason phrase>".
var expectation = regexp.MustCompile(`^#\s*→\s*(\d{3}) ?(.*)$`)

// readmeExamples returns the curl examples of a Markdown file's fenced code
// blocks. Every curl command must be followed by its expectation line, so a
// new example cannot go untested.
func readmeExamples(file string) ([]readmeExample, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		examples []readmeExample
		lines    []string
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	inCode := false
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if !inCode || !strings.HasPrefix(line, "curl ") {
			continue
		}
		ex := readmeExample{where: fmt.Sprintf("%s:%d", file, i+1)}
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSpace(strings.TrimSuffix(line, `\`)) + " " + strings.TrimSpace(lines[i])
		}
		ex.command = line
		if i+1 >= len(lines) {
			return nil, fmt.Errorf("%s: the curl example has no %q line after it", ex.where, "# → <status>")
		}
		m := expectation.FindStringSubmatch(strings.TrimSpace(lines[i+1]))
		if m == nil {
			return nil, fmt.Errorf("%s: the curl example is followed by %q, not %q", ex.where, lines[i+1], "# → <status> <reason>")
		}
		ex.status, _ = strconv.Atoi(m[1])
		if text := http.StatusText(ex.status); text == "" || !strings.HasPrefix(m[2], text) {
			return nil, fmt.Errorf("%s: %q: the status must be followed by its reason phrase %q", ex.where, lines[i+1], text)
		}
		examples = append(examples, ex)
		i++
	}
	return examples, nil
}

// shellWords splits a command line as sh would, for the little shell the
// examples use: words separated by blanks, single quotes (literal), double
// quotes and backslash escapes, and $NAME or ${NAME} taken from vars (a name
// not in vars, or set to "", is an error). Anything else that would make it
// more than one simple command (pipes, redirections, substitutions) is
// refused, since the test could not run it faithfully.
func shellWords(s string, vars map[string]string) ([]string, error) {
	var (
		words  []string
		cur    strings.Builder
		inWord bool
	)
	expand := func(rest string) (int, error) {
		name, n := "", 0
		if strings.HasPrefix(rest, "{") {
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				return 0, errors.New("unterminated ${")
			}
			name, n = rest[1:end], end+1
		} else {
			for n < len(rest) && (rest[n] == '_' || 'A' <= rest[n] && rest[n] <= 'Z' || 'a' <= rest[n] && rest[n] <= 'z' || n > 0 && '0' <= rest[n] && rest[n] <= '9') {
				n++
			}
			name = rest[:n]
		}
		v, ok := vars[name]
		switch {
		case !ok:
			return 0, fmt.Errorf("$%s is not a variable the test knows", name)
		case v == "":
			return 0, fmt.Errorf("$%s is used before it is set", name)
		}
		cur.WriteString(v)
		return n, nil
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
			continue
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
		case c == '"':
			for i++; i < len(s) && s[i] != '"'; i++ {
				switch {
				case s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0:
					i++
					cur.WriteByte(s[i])
				case s[i] == '$':
					n, err := expand(s[i+1:])
					if err != nil {
						return nil, err
					}
					i += n
				case s[i] == '`':
					return nil, errors.New("command substitution is not supported")
				default:
					cur.WriteByte(s[i])
				}
			}
			if i >= len(s) {
				return nil, errors.New("unterminated double quote")
			}
		case c == '\\':
			if i+1 < len(s) {
				i++
				cur.WriteByte(s[i])
			}
		case c == '$':
			n, err := expand(s[i+1:])
			if err != nil {
				return nil, err
			}
			i += n
		case strings.IndexByte("|&;<>()`", c) >= 0:
			return nil, fmt.Errorf("shell syntax %q is not supported", c)
		default:
			cur.WriteByte(c)
		}
		inWord = true
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// curlRequest is what curl would send for a command.
type curlRequest struct {
	method, url string
	header      http.Header
	body        string
}

// parseCurl interprets the curl options the examples use, with curl's
// defaults: -d sends a POST (unless -X says otherwise) with
// "Content-Type: application/x-www-form-urlencoded" unless a Content-Type
// header is given, several -d are joined with "&", and a URL without a
// scheme is http. An option it does not know is an error rather than
// ignored, so a README example cannot do more than the test checks.
func parseCurl(words []string) (curlRequest, error) {
	if len(words) == 0 || words[0] != "curl" {
		return curlRequest{}, errors.New("not a curl command")
	}
	req := curlRequest{header: http.Header{}}
	var data []string
	for i := 1; i < len(words); i++ {
		w := words[i]
		arg := func() (string, error) {
			i++
			if i >= len(words) {
				return "", fmt.Errorf("%s needs an argument", w)
			}
			return words[i], nil
		}
		var err error
		switch {
		case w == "-X" || w == "--request":
			req.method, err = arg()
		case w == "-H" || w == "--header":
			var h string
			if h, err = arg(); err == nil {
				k, v, ok := strings.Cut(h, ":")
				if !ok {
					return curlRequest{}, fmt.Errorf("header %q has no colon", h)
				}
				req.header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
			}
		case w == "-d" || w == "--data" || w == "--data-raw":
			var d string
			if d, err = arg(); err == nil {
				if strings.HasPrefix(d, "@") && w != "--data-raw" {
					return curlRequest{}, fmt.Errorf("%s %s reads a file, which the test does not support", w, d)
				}
				data = append(data, d)
			}
		case w == "--silent" || w == "--include" || w == "--show-error":
		case len(w) > 1 && w[0] == '-' && w[1] != '-' && strings.Trim(w[1:], "siS") == "":
			// -s, -i, -S and their combinations only shape curl's output.
		case strings.HasPrefix(w, "-"):
			return curlRequest{}, fmt.Errorf("curl option %s is not supported by the test (teach parseCurl, with curl's semantics)", w)
		case req.url != "":
			return curlRequest{}, fmt.Errorf("a second URL %q", w)
		default:
			req.url = w
		}
		if err != nil {
			return curlRequest{}, err
		}
	}
	if req.url == "" {
		return curlRequest{}, errors.New("no URL")
	}
	if !strings.Contains(req.url, "://") {
		req.url = "http://" + req.url
	}
	if data != nil {
		req.body = strings.Join(data, "&")
		if req.method == "" {
			req.method = http.MethodPost
		}
		if req.header.Get("Content-Type") == "" {
			req.header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	}
	if req.method == "" {
		req.method = http.MethodGet
	}
	return req, nil
}

// TestREADMECurlExamples runs the curl examples of the READMEs, in order,
// against the real `orders api` process on a schema of its own, and checks
// that each gets the status written after it. The examples address
// localhost:8080 (the documented --listen); the test sends them to the port
// the API listens on. $ORDER_ID is the id of the last order created (from
// its Location header). curl itself is not needed: the commands are parsed
// with curl's semantics (parseCurl), so that sending form data where JSON
// is wanted (issue 8, item 10) shows here as a 415.
func TestREADMECurlExamples(t *testing.T) {
	t.Parallel()
	var examples []readmeExample
	for _, file := range readmes {
		ex, err := readmeExamples(file)
		if err != nil {
			t.Fatal(err)
		}
		examples = append(examples, ex...)
	}
	if len(examples) == 0 {
		t.Fatalf("no curl examples in %v: the test would prove nothing", readmes)
	}

	_, schema := outboxtest.Schema(t)
	api := start(t, "api", "--listen", "127.0.0.1:0", "--database-url", outboxtest.DatabaseURL(), "--schema", schema)
	base := "http://" + api.waitLog(listening)[1]
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // curl does not follow redirects without -L
	}}

	const documented = "http://localhost:8080/"
	vars := map[string]string{"ORDER_ID": ""}
	for _, ex := range examples {
		words, err := shellWords(ex.command, vars)
		if err != nil {
			t.Fatalf("%s: %v", ex.where, err)
		}
		c, err := parseCurl(words)
		if err != nil {
			t.Fatalf("%s: %v", ex.where, err)
		}
		if !strings.HasPrefix(c.url, documented) {
			t.Fatalf("%s: the example addresses %s, not the documented API at %s", ex.where, c.url, documented)
		}
		req, err := http.NewRequest(c.method, base+"/"+strings.TrimPrefix(c.url, documented), strings.NewReader(c.body))
		if err != nil {
			t.Fatalf("%s: %v", ex.where, err)
		}
		req.Header = c.header
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", ex.where, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", ex.where, err)
		}
		if resp.StatusCode != ex.status {
			t.Fatalf("%s: %s\nanswered %d %s, the README says %d", ex.where, ex.command, resp.StatusCode, body, ex.status)
		}
		if resp.StatusCode == http.StatusCreated {
			id, ok := strings.CutPrefix(resp.Header.Get("Location"), "/orders/")
			if !ok || id == "" {
				t.Fatalf("%s: 201 with Location %q", ex.where, resp.Header.Get("Location"))
			}
			vars["ORDER_ID"] = id
		}
	}
	api.stop()
}

// TestParseCurl pins the curl semantics the README test relies on.
func TestParseCurl(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"ORDER_ID": "o-1", "EMPTY": ""}
	for _, c := range []struct {
		command            string
		method, url, ctype string
		body               string
		err                string
	}{
		{`curl -si localhost:8080/orders/$ORDER_ID`, "GET", "http://localhost:8080/orders/o-1", "", "", ""},
		{`curl -si -X POST "localhost:8080/orders/${ORDER_ID}/cancel"`, "POST", "http://localhost:8080/orders/o-1/cancel", "", "", ""},
		{`curl -s localhost:8080/orders -d '{"a": "$x"}'`, "POST", "http://localhost:8080/orders", "application/x-www-form-urlencoded", `{"a": "$x"}`, ""},
		{`curl localhost:8080/orders -H 'Content-Type: application/json' --data "{\"a\": 1}"`, "POST", "http://localhost:8080/orders", "application/json", `{"a": 1}`, ""},
		{`curl -X PUT localhost:8080/x -d a=1 -d b=2`, "PUT", "http://localhost:8080/x", "application/x-www-form-urlencoded", "a=1&b=2", ""},
		{`curl -L localhost:8080/orders`, "", "", "", "", "not supported"},
		{`curl -d @body.json localhost:8080/orders`, "", "", "", "", "reads a file"},
		{`curl localhost:8080/orders | jq .`, "", "", "", "", "not supported"},
		{`curl localhost:8080/orders/$NOPE`, "", "", "", "", "not a variable"},
		{`curl localhost:8080/orders/$EMPTY`, "", "", "", "", "before it is set"},
	} {
		words, err := shellWords(c.command, vars)
		var req curlRequest
		if err == nil {
			req, err = parseCurl(words)
		}
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.command, err, c.err)
			}
		case err != nil:
			t.Errorf("%s: %v", c.command, err)
		case req.method != c.method || req.url != c.url || req.header.Get("Content-Type") != c.ctype || req.body != c.body:
			t.Errorf("%s: %s %s (Content-Type %q) %q; want %s %s (%q) %q", c.command,
				req.method, req.url, req.header.Get("Content-Type"), req.body, c.method, c.url, c.ctype, c.body)
		}
	}
}
