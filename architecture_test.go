package switchyard_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// archLibs are the short names docs/ARCHITECTURE.md gives the outside
// libraries importRules names.
var archLibs = map[string]string{
	"grpc":         grpcLib,
	"etcd":         etcdLib,
	"chi":          chiLib,
	"go-sse":       sseLib,
	"prometheus":   promLib,
	"otel-sdk":     otelSDK,
	"otel-exp":     otelExporters,
	"otel-contrib": otelContrib,
}

// TestArchitectureMap holds the package map that opens
// docs/ARCHITECTURE.md to importRules: one row per package, stating the
// same rule, so the map a newcomer reads is the one the build enforces.
func TestArchitectureMap(t *testing.T) {
	doc, err := os.ReadFile("docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := archRows(t, string(doc))
	for pkg, rule := range importRules {
		row, ok := rows[pkg]
		if !ok {
			t.Errorf("docs/ARCHITECTURE.md has no row for package %s", pkg)
			continue
		}
		if want := ruleMay(pkg, rule); !slices.Equal(row.may, want) {
			t.Errorf("docs/ARCHITECTURE.md: %s may import %v; importRules says %v", pkg, row.may, want)
		}
		if want := ruleNever(rule); !slices.Equal(row.never, want) {
			t.Errorf("docs/ARCHITECTURE.md: %s must not depend on %v; importRules says %v", pkg, row.never, want)
		}
	}
	for pkg := range rows {
		if _, ok := importRules[pkg]; !ok {
			t.Errorf("docs/ARCHITECTURE.md has a row for %s, which importRules does not know", pkg)
		}
	}
}

// archRow is one package's row of the map: its "May import" and "Must not
// depend on" columns, sorted, in importRules' terms.
type archRow struct{ may, never []string }

var backticked = regexp.MustCompile("`([^`]+)`")

// archRows reads the table under "## Packages": | `pkg` | owns | may import |
// must not depend on |.
func archRows(t *testing.T, doc string) map[string]archRow {
	t.Helper()
	_, section, ok := strings.Cut(doc, "\n## Packages\n")
	if !ok {
		t.Fatal(`docs/ARCHITECTURE.md has no "## Packages" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string]archRow{}
	for line := range strings.Lines(section) {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cols := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cols) != 4 {
			t.Fatalf("docs/ARCHITECTURE.md: a package row has %d columns, not 4: %s", len(cols), line)
		}
		pkg := strings.Trim(strings.TrimSpace(cols[0]), "`")
		var row archRow
		if strings.TrimSpace(cols[2]) == "anything" {
			row.may = []string{"anything"}
		}
		for _, m := range backticked.FindAllStringSubmatch(cols[2], -1) {
			row.may = append(row.may, m[1])
		}
		for item := range strings.SplitSeq(cols[3], ",") {
			m := backticked.FindStringSubmatch(item)
			if m == nil {
				continue
			}
			name := m[1]
			if lib, ok := archLibs[name]; ok {
				name = lib
			}
			if strings.Contains(item, "(itself)") {
				name += " (itself)"
			}
			row.never = append(row.never, name)
		}
		slices.Sort(row.may)
		slices.Sort(row.never)
		rows[pkg] = row
	}
	return rows
}

// ruleMay is rule's "may" as the map states it: without the package itself.
func ruleMay(pkg string, rule importRule) []string {
	if rule.any {
		return []string{"anything"}
	}
	var may []string
	for _, m := range rule.may {
		if m != pkg {
			may = append(may, m)
		}
	}
	slices.Sort(may)
	return may
}

// ruleNever is rule's bans as the map states them.
func ruleNever(rule importRule) []string {
	never := slices.Clone(rule.neverDeps)
	for _, b := range rule.neverImports {
		never = append(never, b+" (itself)")
	}
	slices.Sort(never)
	return never
}
