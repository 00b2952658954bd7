package integration_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchyard/switchyard/internal/syncbuf"
)

// browser is a headless Chromium driven by chromedp, for one test: its tab
// lives until the test ends.
type browser struct {
	tb  testing.TB
	ctx context.Context
	out *syncbuf.Buffer
}

// mustStartBrowser starts Chromium with the flags that work on these
// machines (TOOLCHAIN.md). Without Chromium the test is skipped, except in
// CI, where it fails: CI installs it (.ci/run). opts go to the tab's
// context (listeners).
func mustStartBrowser(t *testing.T, opts ...chromedp.ContextOption) *browser {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("chromium is not on PATH (%v): CI must install it (.ci/run)", err)
		}
		t.Skipf("chromium is not on PATH: %v", err)
	}
	b := &browser{tb: t, out: &syncbuf.Buffer{}}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // as root
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 1000),
		chromedp.CombinedOutput(b.out),
	)
	t.Cleanup(cancelAlloc) // runs last: waits for the browser process and its output copier
	bctx, cancelBrowser := chromedp.NewContext(actx, opts...)
	t.Cleanup(cancelBrowser) // closes the browser
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("browser output:\n%s", b.out.String())
		}
	})
	// Start the browser with no deadline (a deadline on the first Run
	// bounds the whole browser's life); each step gets its own.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	b.ctx = bctx
	return b
}

// step is a context for one step of the test, bounded by d.
func (b *browser) step(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(b.ctx, d)
	b.tb.Cleanup(cancel)
	return ctx
}
