package switchyard_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The README is the front door: TestReadme holds it, and every page under
// docs/, to links that resolve and headings with something under them, and
// the README's commands to the ones CI and the Makefile run. Its curl
// examples are run against a real node by integration's TestBinarySmoke
// (readmeExamples).

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^(#{1,6}) (.+)$`)
	makeCmd   = regexp.MustCompile(`(?m)^make ([a-z][a-z0-9-]*)`)
	mkTarget  = regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`)
)

func TestReadme(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append([]string{"README.md"}, pages...) {
		checkPage(t, p)
	}

	readme := readFile(t, "README.md")
	// The README's test command is CI's.
	ci := readFile(t, ".ci/run")
	blocks := shellBlocks(readme)
	if len(blocks) == 0 || !strings.HasPrefix(blocks[0], "make run ") || !strings.Contains(blocks[0], "\nmake test ") {
		t.Errorf("README's first shell block is not make run and make test:\n%s", blocks)
	}
	if !regexp.MustCompile(`(?m)^step test \S+ make test$`).MatchString(ci) {
		t.Error(".ci/run does not run the README's test command, make test")
	}
	// Every make target the README names exists.
	makefile := readFile(t, "Makefile")
	var targets []string
	for _, m := range mkTarget.FindAllStringSubmatch(makefile, -1) {
		targets = append(targets, m[1])
	}
	for _, b := range blocks {
		for _, m := range makeCmd.FindAllStringSubmatch(b, -1) {
			if !slices.Contains(targets, m[1]) {
				t.Errorf("README runs make %s: the Makefile has no such target", m[1])
			}
		}
	}
}

// checkPage fails on a link to a file that does not exist, an anchor no
// heading of its page makes, and a heading with nothing under it.
func checkPage(t *testing.T, page string) {
	text := readFile(t, page)
	prose := stripFences(text)
	for _, m := range mdLink.FindAllStringSubmatch(prose, -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		path := page
		if file != "" {
			path = filepath.Join(filepath.Dir(page), file)
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s: no such file", page, target)
				continue
			}
		}
		if anchor != "" && strings.HasSuffix(path, ".md") && !slices.Contains(anchors(readFile(t, path)), anchor) {
			t.Errorf("%s links to %s: %s has no heading with that anchor", page, target, path)
		}
	}
	lines := strings.Split(prose, "\n")
	var last string
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if mdHeading.MatchString(l) && last != "" && mdHeading.MatchString(last) && len(strings.Fields(l)[0]) <= len(strings.Fields(last)[0]) {
			t.Errorf("%s: heading %q has nothing under it", page, last)
		}
		last = l
	}
}

// anchors are the ids GitHub gives a page's headings.
func anchors(text string) []string {
	var out []string
	seen := map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(stripFences(text), -1) {
		a := strings.ToLower(strings.TrimSpace(m[2]))
		a = regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(a, "")
		a = strings.ReplaceAll(a, " ", "-")
		if n := seen[a]; n > 0 {
			out = append(out, a+"-"+strconv.Itoa(n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// stripFences blanks the fenced code blocks of a markdown text.
func stripFences(text string) string {
	var b strings.Builder
	in := false
	for l := range strings.Lines(text) {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			b.WriteString("\n")
			continue
		}
		if in {
			b.WriteString("\n")
			continue
		}
		b.WriteString(l)
	}
	return b.String()
}

// shellBlocks are the README's ```sh blocks.
func shellBlocks(text string) []string {
	var out []string
	for _, part := range strings.Split(text, "```sh\n")[1:] {
		block, _, _ := strings.Cut(part, "```")
		out = append(out, block)
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
