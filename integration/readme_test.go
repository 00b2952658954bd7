package integration_test

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// readmeExample is one curl command of the README, as the README writes
// it: its method, URL, headers and body.
type readmeExample struct {
	section string
	url     string
	header  http.Header
	body    string
}

// readmeExamples are the curl commands of the README's sections that run
// against one node of `make run` (`switchyard demo` on 127.0.0.1:8080): the
// commands a newcomer pastes first, which TestBinarySmoke runs as they are
// written.
func readmeExamples(t *testing.T) []readmeExample {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []readmeExample
	for _, section := range []string{"## A streamed job", "## OpenAI-compatible API"} {
		_, text, ok := strings.Cut(string(b), "\n"+section+"\n")
		if !ok {
			t.Fatalf("README has no %q section", section)
		}
		text, _, _ = strings.Cut(text, "\n## ")
		for _, part := range strings.Split(text, "```sh\n")[1:] {
			block, _, _ := strings.Cut(part, "```")
			block = strings.ReplaceAll(block, "\\\n", " ")
			for line := range strings.Lines(block) {
				if strings.HasPrefix(line, "curl ") {
					out = append(out, parseCurl(t, section, line))
				}
			}
		}
	}
	if len(out) < 2 {
		t.Fatalf("README: %d curl examples found in its single-node sections", len(out))
	}
	return out
}

// parseCurl reads the curl options the README uses: -H, -d and the URL
// (-N and -s change nothing here).
func parseCurl(t *testing.T, section, line string) readmeExample {
	t.Helper()
	ex := readmeExample{section: section, header: http.Header{}}
	args := shellWords(line)
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-H" && i+1 < len(args):
			k, v, _ := strings.Cut(args[i+1], ":")
			ex.header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
			i++
		case a == "-d" && i+1 < len(args):
			ex.body = args[i+1]
			i++
		case a == "-N" || a == "-s":
		case strings.HasPrefix(a, "http://"):
			ex.url = a
		default:
			t.Fatalf("README, %s: curl option %q is not one this test knows: %s", section, a, line)
		}
	}
	if ex.url == "" {
		t.Fatalf("README, %s: a curl without a URL: %s", section, line)
	}
	return ex
}

// shellWords splits a command line at spaces outside single quotes.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	quoted, in := false, false
	for _, r := range strings.TrimSpace(line) {
		switch {
		case r == '\'':
			quoted, in = !quoted, true
		case r == ' ' && !quoted:
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// runReadmeExamples runs each example against the node at httpAddr in
// place of 127.0.0.1:8080: each must answer 200 and stream to its end (a
// job's done event, or the OpenAI stream's [DONE]).
func runReadmeExamples(t *testing.T, httpAddr string) {
	for _, ex := range readmeExamples(t) {
		url := strings.Replace(ex.url, "127.0.0.1:8080", httpAddr, 1)
		method := http.MethodGet
		var body io.Reader
		if ex.body != "" {
			method, body = http.MethodPost, strings.NewReader(ex.body)
		}
		req, err := http.NewRequestWithContext(t.Context(), method, url, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = ex.header
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("README, %s: %v", ex.section, err)
		}
		got, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("README, %s: %s %s: %d %v\n%s", ex.section, method, ex.url, res.StatusCode, err, got)
		}
		if !strings.Contains(string(got), "event: done") && !strings.Contains(string(got), "data: [DONE]") {
			t.Errorf("README, %s: %s %s did not stream to its end:\n%s", ex.section, method, ex.url, got)
		}
	}
}
