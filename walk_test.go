package switchyard_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strings"
	"testing"
)

// walkStep is one numbered step of a walk in docs/ARCHITECTURE.md: the
// file it names and the functions it names in that file.
type walkStep struct {
	line  int
	file  string
	funcs []string
}

// walkSections are the walks a test holds to the code.
var walkSections = []string{"## Follow a job on one node", "## Follow a job across nodes"}

var stepStart = regexp.MustCompile("^[0-9]+\\. `([^`]+\\.go)`((?:,? `[A-Za-z_][A-Za-z0-9_.]*`)*)")

// TestArchitectureWalk holds each walk of docs/ARCHITECTURE.md to the
// code: every step names a file that exists and functions declared in it
// ("Type.Method" for a method, "Name" for a function or a type), and every
// other .go file the walks mention exists.
func TestArchitectureWalk(t *testing.T) {
	doc, err := os.ReadFile("docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, title := range walkSections {
		steps, mentioned := walkOf(t, string(doc), title)
		if len(steps) < 10 {
			t.Errorf("%s: %d steps read; the walk's format changed?", title, len(steps))
		}
		for _, s := range steps {
			decls := declsOf(t, s.file)
			for _, f := range s.funcs {
				if !decls[f] {
					t.Errorf("docs/ARCHITECTURE.md:%d: %s declares no %s", s.line, s.file, f)
				}
			}
		}
		for _, f := range mentioned {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("docs/ARCHITECTURE.md, %q: %s does not exist", title, f)
			}
		}
	}
}

// walkOf reads the steps of the section titled title, and every path of a
// .go file the section mentions.
func walkOf(t *testing.T, doc, title string) (steps []walkStep, mentioned []string) {
	t.Helper()
	before, section, ok := strings.Cut(doc, "\n"+title+"\n")
	if !ok {
		t.Fatalf("docs/ARCHITECTURE.md has no %q section", title)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	first := strings.Count(before, "\n") + 3
	for i, line := range strings.Split(section, "\n") {
		m := stepStart.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := walkStep{line: first + i, file: m[1]}
		for _, f := range backticked.FindAllStringSubmatch(m[2], -1) {
			s.funcs = append(s.funcs, f[1])
		}
		steps = append(steps, s)
	}
	for _, m := range regexp.MustCompile("`([A-Za-z0-9_/]+/[A-Za-z0-9_]+\\.go)`").FindAllStringSubmatch(section, -1) {
		mentioned = append(mentioned, m[1])
	}
	return steps, mentioned
}

// declsOf is every function, method ("Recv.Name") and type declared in a
// file.
func declsOf(t *testing.T, file string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", file, err)
	}
	decls := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			name := d.Name.Name
			if d.Recv != nil && len(d.Recv.List) > 0 {
				name = recvName(d.Recv.List[0].Type) + "." + name
			}
			decls[name] = true
		case *ast.GenDecl:
			for _, s := range d.Specs {
				if ts, ok := s.(*ast.TypeSpec); ok {
					decls[ts.Name.Name] = true
				}
			}
		}
	}
	return decls
}

// recvName is a receiver's type name, without a pointer or type
// parameters.
func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}
