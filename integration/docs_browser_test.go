package integration_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchyard/switchyard/openapi"
)

// /docs in a real browser, with nothing but the node to load from: Swagger
// UI lists every operation of the document and every schema, the event
// streams' included. The test saves a screenshot of the page, an artifact
// for a person to look at (bin/artifacts/docs.png, or
// $SWITCHYARD_ARTIFACTS/docs.png), never committed.
func TestDocsPageInBrowser(t *testing.T) {
	t.Parallel()
	b := mustStartBrowser(t) // logs the browser's output if the test fails
	n := MustStartNode(t, nil)

	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openapi.JSON, &doc); err != nil {
		t.Fatal(err)
	}
	var wantOps []string
	for path, ops := range doc.Paths {
		for method := range ops {
			wantOps = append(wantOps, strings.ToUpper(method)+" "+path)
		}
	}
	slices.Sort(wantOps)

	ctx := b.step(30 * time.Second)
	if err := chromedp.Do(ctx, chromedp.Navigate(baseURL(n)+"/docs")); err != nil {
		t.Fatalf("load /docs: %v", err)
	}
	if err := chromedp.Do(ctx, chromedp.WaitVisible(".opblock")); err != nil {
		t.Fatalf("no operation rendered: %v", err)
	}
	type page struct {
		Ops     []string `json:"ops"`
		Schemas []string `json:"schemas"`
		Title   string   `json:"title"`
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[page](`({
		ops: [...document.querySelectorAll('.opblock')].map(o =>
			o.querySelector('.opblock-summary-method').textContent + ' ' +
			o.querySelector('.opblock-summary-path').getAttribute('data-path')).sort(),
		schemas: [...document.querySelectorAll('.models .model-container')].map(m => m.getAttribute('data-name')).sort(),
		title: document.querySelector('.info .title') ? document.querySelector('.info .title').textContent : '',
	})`))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Ops, wantOps) {
		t.Errorf("the page lists\n %v\nthe document has\n %v", got.Ops, wantOps)
	}
	for name := range doc.Components.Schemas {
		if !slices.Contains(got.Schemas, name) {
			t.Errorf("the page does not list schema %s (it lists %v)", name, got.Schemas)
		}
	}
	for _, s := range []string{"EventStream", "WorkerStream", "Problem", "Envelope"} {
		if !slices.Contains(got.Schemas, s) {
			t.Errorf("schema %s missing from the page", s)
		}
	}
	if !strings.HasPrefix(got.Title, "Switchyard API") {
		t.Errorf("title %q", got.Title)
	}

	// Open the submit operation and the event stream schema, so the picture
	// shows a route with its parameters and the events.
	// The picture is a step of its own: a full-page screenshot of the
	// rendered document is slow on a busy machine.
	ctx = b.step(60 * time.Second)
	_ = chromedp.Do(ctx, chromedp.Click(`#operations-jobs-submitJob .opblock-summary-control`))
	_ = chromedp.Do(ctx, chromedp.Click(`#model-EventStream button`))
	time.Sleep(300 * time.Millisecond) // let the expanded sections render
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("SWITCHYARD_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", "bin", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "docs.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(path)
	t.Logf("screenshot of /docs: %s (%d operations, %d schemas)", abs, len(got.Ops), len(got.Schemas))
}
