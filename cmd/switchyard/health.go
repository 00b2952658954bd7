package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// runHealth asks a node's /readyz (or any URL given) and fails unless it
// answers 2xx within the timeout. It exists for container health checks: the
// image is FROM scratch, with no shell, curl or wget, so the binary checks
// itself (docker-compose.yml: `test: ["CMD", "/switchyard", "health"]`).
func runHealth(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080/readyz", "URL to GET; healthy when it answers 2xx")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout %v: must be positive", *timeout)
	}
	return checkHealth(ctx, *url, *timeout)
}

// checkHealth GETs url once. A non-2xx answer is an error carrying the
// status and the start of the body (a node says why it is not ready).
func checkHealth(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("--url %q: %w", url, err)
	}
	// One request and done: no connection is kept for a next one.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("GET %s: no answer within %v", url, timeout)
		}
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 512))
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("GET %s: %s: %s", url, res.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
