package web_test

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/web"
)

func mustNew(tb testing.TB) *web.Handler {
	tb.Helper()
	h, err := web.New(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusTeapot) // tells the test's 404s from the handler's own
	}))
	if err != nil {
		tb.Fatalf("web.New: %v", err)
	}
	return h
}

func get(tb testing.TB, h http.Handler, method, path string, hdr map[string]string) (*http.Response, string) {
	tb.Helper()
	r := httptest.NewRequest(method, path, nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// The page: HTML, revalidated on every load, under the strict policy, and
// naming this build's assets.
func TestIndex(t *testing.T) {
	h := mustNew(t)
	res, body := get(t, h, "GET", "/", nil)
	want := map[string]string{
		"Content-Type":            "text/html; charset=utf-8",
		"Cache-Control":           "no-cache",
		"Content-Security-Policy": web.CSP,
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %d", res.StatusCode)
	}
	for k, v := range want {
		if got := res.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if strings.Contains(body, "{{") {
		t.Errorf("the page still holds a template marker")
	}
	if !strings.Contains(body, `src="`+h.AssetPath()+`/app.js"`) {
		t.Errorf("the page does not load %s/app.js", h.AssetPath())
	}
	// Revalidation: the ETag answers 304.
	res2, _ := get(t, h, "GET", "/", map[string]string{"If-None-Match": res.Header.Get("ETag")})
	if res2.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match with the ETag: %d, want 304", res2.StatusCode)
	}
	res3, body3 := get(t, h, "HEAD", "/", nil)
	if res3.StatusCode != http.StatusOK || body3 != "" || res3.Header.Get("Content-Security-Policy") != web.CSP {
		t.Errorf("HEAD /: %d, body %d bytes, CSP %q", res3.StatusCode, len(body3), res3.Header.Get("Content-Security-Policy"))
	}
}

// The CSP allows the node's own origin and nothing else, and nothing
// inline: every directive that loads something says 'self' or 'none'.
func TestCSPIsSelfOnly(t *testing.T) {
	for _, d := range strings.Split(web.CSP, ";") {
		f := strings.Fields(d)
		if len(f) < 2 {
			t.Fatalf("directive %q has no source", d)
		}
		for _, src := range f[1:] {
			if src != "'self'" && src != "'none'" {
				t.Errorf("directive %s allows %s", f[0], src)
			}
		}
	}
	if !strings.HasPrefix(web.CSP, "default-src 'none'") {
		t.Errorf("CSP does not start from default-src 'none': %s", web.CSP)
	}
}

var (
	attrRef   = regexp.MustCompile(`(?:src|href)="([^"]*)"`)
	importRef = regexp.MustCompile(`(?m)^\s*import\s[^'"]*['"]([^'"]+)['"]`)
)

// Every asset the page and its modules name is served, from this build's
// path, with its content type and cached for good; nothing is loaded from
// another origin.
func TestAssetsServed(t *testing.T) {
	h := mustNew(t)
	_, index := get(t, h, "GET", "/", nil)
	var names []string
	for _, m := range attrRef.FindAllStringSubmatch(index, -1) {
		if strings.HasPrefix(m[1], "#") {
			continue // in-page link
		}
		name, ok := strings.CutPrefix(m[1], h.AssetPath()+"/")
		if !ok {
			t.Errorf("the page loads %q, not from %s/", m[1], h.AssetPath())
			continue
		}
		names = append(names, name)
	}
	// Follow the module graph: imports are relative, so they stay in the
	// versioned path.
	for i := 0; i < len(names); i++ {
		if !strings.HasSuffix(names[i], ".js") {
			continue
		}
		_, src := get(t, h, "GET", h.AssetPath()+"/"+names[i], nil)
		for _, m := range importRef.FindAllStringSubmatch(src, -1) {
			dep, ok := strings.CutPrefix(m[1], "./")
			if !ok {
				t.Errorf("%s imports %q: not a relative module", names[i], m[1])
				continue
			}
			if !slices.Contains(names, dep) {
				names = append(names, dep)
			}
		}
	}
	types := map[string]string{".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
	for _, name := range names {
		res, body := get(t, h, "GET", h.AssetPath()+"/"+name, nil)
		if res.StatusCode != http.StatusOK || body == "" {
			t.Errorf("%s: %d, %d bytes", name, res.StatusCode, len(body))
			continue
		}
		ext := name[strings.LastIndexByte(name, '.'):]
		if got := res.Header.Get("Content-Type"); got != types[ext] {
			t.Errorf("%s: Content-Type %q, want %q", name, got, types[ext])
		}
		if got := res.Header.Get("Cache-Control"); got != "public, max-age=31536000, immutable" {
			t.Errorf("%s: Cache-Control %q", name, got)
		}
		if res.Header.Get("Content-Security-Policy") != web.CSP || res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: security headers missing", name)
		}
	}
	for _, want := range []string{"app.js", "sse.js", "app.css", "favicon.svg"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s is not reachable from the page", want)
		}
	}
}

// What the policy would block is not in the files: inline scripts, inline
// styles and handlers, and URLs of other origins in what the page loads.
func TestNothingInline(t *testing.T) {
	h := mustNew(t)
	_, index := get(t, h, "GET", "/", nil)
	for _, tag := range regexp.MustCompile(`<script[^>]*>[^<]*`).FindAllString(index, -1) {
		if !strings.Contains(tag, " src=") || !strings.HasSuffix(tag, ">") {
			t.Errorf("index.html has an inline script: %q", tag)
		}
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`\sstyle=`),
		regexp.MustCompile(`<style`),
		regexp.MustCompile(`\son[a-z]+=`),
	} {
		if m := bad.FindString(index); m != "" {
			t.Errorf("index.html has %q, which the CSP blocks", m)
		}
	}
	err := fs.WalkDir(web.Files(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".js") {
			return err
		}
		b, err := fs.ReadFile(web.Files(), p)
		if err != nil {
			return err
		}
		for _, s := range []string{".style.", "innerHTML", "eval(", "new Function"} {
			if strings.Contains(string(b), s) {
				t.Errorf("%s uses %s", p, s)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Another build's assets, the page under the asset path, and names that
// are not there all go to the not-found handler.
func TestNotFound(t *testing.T) {
	h := mustNew(t)
	for _, p := range []string{
		web.Prefix + "0000000000000000/app.js",
		h.AssetPath() + "/index.html",
		h.AssetPath() + "/nope.js",
		h.AssetPath() + "/",
		h.AssetPath(),
		"/index.html",
	} {
		if res, _ := get(t, h, "GET", p, nil); res.StatusCode != http.StatusTeapot {
			t.Errorf("GET %s: %d, want the not-found handler", p, res.StatusCode)
		}
	}
}

// The version follows the content: two handlers of one build agree.
func TestVersionStable(t *testing.T) {
	a, b := mustNew(t), mustNew(t)
	if a.AssetPath() != b.AssetPath() || !strings.HasPrefix(a.AssetPath(), web.Prefix) || len(a.AssetPath()) != len(web.Prefix)+16 {
		t.Fatalf("asset paths %q and %q", a.AssetPath(), b.AssetPath())
	}
}
