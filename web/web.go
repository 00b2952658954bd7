// Package web is the page every node serves at "/": a playground that
// submits, streams, cancels and resumes jobs, and a live view of the
// cluster. It is plain HTML, CSS and JavaScript modules embedded in the
// binary: no build step, and nothing loaded from anywhere but the node.
//
// The assets are served under Prefix plus a version made of their content
// hash, so they can be cached for good (a new binary with other assets has
// another version, and its page names it); the page itself is revalidated
// on every load. Every response carries a Content-Security-Policy that
// allows the node's own origin only: no inline script or style, no other
// host, no framing.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// Prefix is the path under which the assets are served: Prefix + version +
// "/" + file.
const Prefix = "/ui/"

// CSP is the Content-Security-Policy of the page and its assets: the node's
// own origin for scripts, styles, images and connections (fetch,
// EventSource), nothing else, and nothing inline.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// assetsMarker is what index.html writes where the versioned asset path
// goes.
const assetsMarker = "{{ASSETS}}"

//go:embed static
var static embed.FS

// contentTypes are the only file kinds served: an asset of another kind is
// a mistake caught by the package's tests, not a guess at serve time.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// Files returns the embedded page and assets (index.html, with its asset
// path still a marker, and the files it loads).
func Files() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic("web: " + err.Error()) // "static" is a valid path: never
	}
	return sub
}

// Handler serves the page and its assets.
type Handler struct {
	version  string
	index    []byte
	etag     string
	files    map[string][]byte // by name, relative to static/
	notFound http.Handler
}

// New returns the handler of the embedded page. notFound answers a path
// it does not serve (nil: http.NotFound).
func New(notFound http.Handler) (*Handler, error) {
	if notFound == nil {
		notFound = http.NotFoundHandler()
	}
	h := &Handler{files: map[string][]byte{}, notFound: notFound}
	sum := sha256.New()
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(p, "static/")
		if _, ok := contentTypes[path.Ext(name)]; !ok {
			return fmt.Errorf("web: no content type for %s", name)
		}
		h.files[name] = b
		// WalkDir goes in lexical order: the hash is the same for the same
		// files.
		fmt.Fprintf(sum, "%s\x00%d\x00", name, len(b))
		sum.Write(b)
		return nil
	})
	if err != nil {
		return nil, err
	}
	h.version = hex.EncodeToString(sum.Sum(nil))[:16]
	index, ok := h.files["index.html"]
	if !ok {
		return nil, fmt.Errorf("web: no index.html")
	}
	h.index = bytes.ReplaceAll(index, []byte(assetsMarker), []byte(h.AssetPath()))
	h.etag = `"` + h.version + `"`
	return h, nil
}

// AssetPath is where the assets of this build are served, without a
// trailing slash: Prefix + version.
func (h *Handler) AssetPath() string { return Prefix + h.version }

// ServeHTTP serves "/" (the page) and AssetPath()/name (an asset); GET and
// HEAD only, which the router decides.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/" {
		// Revalidated on every load (the ETag makes that a 304), so a node
		// with new assets is picked up at once.
		h.serve(w, r, "index.html", h.index, "no-cache")
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, h.AssetPath()+"/")
	b, found := h.files[name]
	if !ok || !found || name == "index.html" {
		// Another version's assets included: a page that names them is
		// from another build and must be reloaded, not fed these.
		h.notFound.ServeHTTP(w, r)
		return
	}
	h.serve(w, r, name, b, "public, max-age=31536000, immutable")
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, name string, b []byte, cache string) {
	hd := w.Header()
	hd.Set("Content-Type", contentTypes[path.Ext(name)])
	hd.Set("Cache-Control", cache)
	hd.Set("ETag", h.etag)
	hd.Set("Content-Security-Policy", CSP)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	// ServeContent answers If-None-Match with 304 from the ETag above, and
	// HEAD and ranges.
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}
